"""Compiles every kernels/*.cu (after kernels/common.cuh, as gpumem does) with NVRTC, without a
GPU: catches a kernel that does not compile before a device call is spent on it.

NVRTC comes from the nvidia-cuda-nvrtc wheel (no driver needed):
    pip download --no-deps nvidia-cuda-nvrtc-cu12 -d /tmp/nvrtc && (cd /tmp/nvrtc && unzip -q -o *.whl)
    python3 scripts/nvrtc-check.py [/tmp/nvrtc] [kernels/x.cu ...]
Exit 0 when every source compiles for compute_90; else each failure's log and exit 1."""
import ctypes, glob, os, sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
args = sys.argv[1:]
where = args.pop(0) if args and os.path.isdir(args[0]) else "/tmp/nvrtc"
libs = glob.glob(os.path.join(where, "nvidia/cuda_nvrtc/lib/libnvrtc.so*"))
libs = [l for l in libs if "builtins" not in l and ".alt." not in l]
if not libs:
    sys.exit(f"no libnvrtc.so under {where}: see this script's docstring")
nvrtc = ctypes.CDLL(libs[0])
common = open(os.path.join(root, "kernels/common.cuh")).read()
files = args or sorted(glob.glob(os.path.join(root, "kernels/*.cu")))
ok = True
for f in files:
    src = (common + "\n" + open(f).read()).encode()
    prog = ctypes.c_void_p()
    nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, os.path.basename(f).encode(), 0, None, None)
    opts = (ctypes.c_char_p * 1)(b"--gpu-architecture=compute_90")
    rc = nvrtc.nvrtcCompileProgram(prog, 1, opts)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    print(f"{os.path.relpath(f, root)}: {'ok' if rc == 0 else 'FAILED'}")
    if rc != 0:
        print(log.value.decode())
        ok = False
sys.exit(0 if ok else 1)
