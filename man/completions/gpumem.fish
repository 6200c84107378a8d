# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_gpumem_global_optspecs
    string join \n v/verbose color= h/help V/version
end

function __fish_gpumem_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_gpumem_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_gpumem_using_subcommand
    set -l cmd (__fish_gpumem_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c gpumem -n "__fish_gpumem_needs_command" -l color -d 'Colour in the output: `auto` (on a terminal, unless NO_COLOR is set), `always`, `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpumem -n "__fish_gpumem_needs_command" -s v -l verbose -d 'Log what the reader, the runner and the allocator do on stderr: -v for each file, iteration and segment (debug), -vv also every op (trace). RUST_LOG overrides it'
complete -c gpumem -n "__fish_gpumem_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpumem -n "__fish_gpumem_needs_command" -s V -l version -d 'Print version'
complete -c gpumem -n "__fish_gpumem_needs_command" -f -a "run" -d 'Run a workload on the simulated device and show where the memory went'
complete -c gpumem -n "__fish_gpumem_needs_command" -f -a "summary" -d 'Summarize a memory snapshot: gpumem\'s, or one PyTorch wrote.'
complete -c gpumem -n "__fish_gpumem_needs_command" -f -a "check" -d 'Fail CI when peak memory regresses: workloads run on the simulated device (no GPU needed) against a committed baseline.'
complete -c gpumem -n "__fish_gpumem_needs_command" -f -a "export" -d 'Write a snapshot in another tool\'s format.'
complete -c gpumem -n "__fish_gpumem_needs_command" -f -a "diff" -d 'Compare two snapshots or runs: peaks, categories, allocation sites, segments.'
complete -c gpumem -n "__fish_gpumem_needs_command" -f -a "fit" -d 'Find the largest batch size (or another integer parameter) that fits on a device.'
complete -c gpumem -n "__fish_gpumem_needs_command" -f -a "plot" -d 'Draw the memory timeline of a snapshot as an SVG picture.'
complete -c gpumem -n "__fish_gpumem_needs_command" -f -a "replay" -d 'Replay a PyTorch allocator trace step by step, or a snapshot\'s allocations under other allocator settings ("would this have saved my run?").'
complete -c gpumem -n "__fish_gpumem_needs_command" -f -a "bench" -d 'Measure the allocator: ns per alloc+free pair with event recording on and off.'
complete -c gpumem -n "__fish_gpumem_needs_command" -f -a "compare-torch" -d 'Check gpumem\'s model presets against PyTorch: every recorded case, each iteration\'s figures.'
complete -c gpumem -n "__fish_gpumem_needs_command" -f -a "devices" -d 'List this machine\'s NVIDIA GPUs: memory total, used and free, driver and CUDA versions, and the processes holding memory.'
complete -c gpumem -n "__fish_gpumem_needs_command" -f -a "selftest" -d 'Check `--device cuda` against `--device cpu`, op by op, forward and backward, in float32 and bf16.'
complete -c gpumem -n "__fish_gpumem_needs_command" -f -a "completions" -d 'Print a shell completion script for gpumem: every command, flag and value.'
complete -c gpumem -n "__fish_gpumem_needs_command" -f -a "mcp" -d 'Serve gpumem\'s answers to coding agents over the Model Context Protocol (stdio).'
complete -c gpumem -n "__fish_gpumem_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l preset -d 'A workload built into gpumem instead of a file (they are listed below); `preset:NAME` works as a workload path too' -r -f -a "gpt2-small\t'GPT-2 small (124M) trained with AdamW, batch 8 x 1024 tokens (PyTorch\'s figures to the byte)'
mlp-adam\t'an MLP trained with Adam'
mlp-leak\t'an MLP whose loop keeps every loss with its graph: a leak'
fragmentation-oom\t'an out-of-memory from fragmentation that expandable segments fix'
capacity-oom\t'an out-of-memory from capacity: Adam\'s state does not fit a 2 GiB card'"
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l batch -d 'The batch size (a preset\'s or config\'s `batch`, a script\'s `batch` parameter): the same as `--param batch=N`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l seq -d 'Tokens per sample (a config\'s or GPT preset\'s `seq`): the same as `--param seq=N`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l optimizer -d 'With a bare config: the optimizer (`[train] optimizer`)' -r -f -a "sgd\t''
sgd_momentum\t''
adam\t''
adamw\t''
adam8bit\t''
adamw8bit\t''
paged_adamw8bit\t''
torchao_adam8bit\t''
torchao_adamw8bit\t''
torchao_adam4bit\t''
torchao_adamw4bit\t''
none\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l precision -d 'With a bare config: `fp32` or `bf16-autocast` (`[train] precision`)' -r -f -a "fp32\t''
bf16-autocast\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l mode -d 'With a bare config: `train`, `inference` for a no-grad forward, or `generate` for `model.generate` of --new-tokens tokens after a --seq prompt (`[train] mode`)' -r -f -a "train\t''
inference\t''
generate\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l new-tokens -d 'Tokens `model.generate` makes after the prompt (a config\'s `[generate] new_tokens`): the same as `--param new_tokens=N`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l dtype -d 'With a bare config: the weights\' dtype, `fp32` or `bf16` (`[model] dtype`)' -r -f -a "fp32\t''
bf16\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l attention -d 'With a bare config: `sdpa` or `eager` (`[model] attention`)' -r -f -a "sdpa\t''
eager\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l lora-r -d 'With a bare config: peft\'s LoRA of rank R (`[model.lora] r`); --lora-alpha, --lora-dropout and --lora-targets set the rest (peft\'s defaults: alpha 8, dropout 0, q_proj,v_proj)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l lora-alpha -d 'With --lora-r: `[model.lora] alpha`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l lora-dropout -d 'With --lora-r: `[model.lora] dropout`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l lora-targets -d 'With --lora-r: the targeted linears, comma-separated (`[model.lora] target_modules`), or `all-linear` (peft\'s: every linear of the layers) or `attention` (the attention\'s projections: q_proj,k_proj,v_proj,o_proj, or Phi-3\'s qkv_proj,o_proj). Default: peft\'s for the model type (q_proj,v_proj; Phi-3\'s qkv_proj)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l bucket-cap-mb -d 'With --ddp: `[distributed] bucket_cap_mb` (PyTorch\'s default 25)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l zero -d 'With a bare config: train under DeepSpeed ZeRO stage 1, 2 or 3 (`[distributed] strategy = "zero1"`, `"zero2"` or `"zero3"`): the flat parameters, a float32 master partition and Adam\'s state per rank, the reduction bucket (`reduce_bucket_size`, 5e8 elements) and the partition\'s gradients, as DeepSpeed 0.19.6 allocates them. Rank 0 is shown. Stage 3 is modelled at world size 1 only' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l reduce-bucket-size -d 'With --zero: DeepSpeed\'s `reduce_bucket_size` in elements (default 500000000)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l world-size -d 'With --ddp, --fsdp2 or --zero: the number of ranks (`[distributed] world_size`, default 1). Every rank holds what rank 0 holds; under FSDP2 each a 1/N shard, the model built on the meta device when N > 1' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l param-dtype -d 'With --fsdp2: `MixedPrecisionPolicy(param_dtype=...)`: fp32 (none, the default) or bf16 (then give --reduce-dtype fp32)' -r -f -a "fp32\t''
bf16\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l reduce-dtype -d 'With --fsdp2: `MixedPrecisionPolicy(reduce_dtype=...)`: fp32 or bf16 (the default: param_dtype)' -r -f -a "fp32\t''
bf16\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l device -d 'Where to run, instead of the workload\'s `device`: `sim`, the simulated device (the default; sizes and addresses only, no GPU needed), `cpu` (real numbers in host memory at the same addresses: the same allocator figures, plus each iteration\'s loss), `cuda` (the first GPU: segments from its NVIDIA driver at its addresses, with NVML\'s view of the process, and the ops computed there: on the GPU where a kernel of gpumem\'s takes them, else on the host with the cpu device\'s kernels; the run lists which), or `cuda-memory` (the GPU\'s segments only, nothing computed: as fast as `sim`)' -r -f -a "sim\t''
cpu\t''
cuda\t''
cuda-memory\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l capacity -d 'Device memory of the simulated GPU instead of the workload\'s (e.g. 24GiB, 80GiB; GB is read as GiB, as a card\'s "24GB" means, and a bare number is refused)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l iterations -d 'Iterations of the body instead of the workload\'s' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l snapshot -d 'Also write a gpumem snapshot (versioned JSON: segments, blocks, the event trace with tags and categories, settings) to FILE, atomically' -r -F
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l save-grads -d 'On a data device (`--device cpu`): write every named parameter\'s gradient, as it is just before the first optimizer step, to FILE (safetensors, float32, by state_dict name), to compare with PyTorch\'s' -r -F
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l param -d 'Set an integer parameter: a script\'s `[params]` entry or a preset\'s integer key (batch, layers, seq, d_model, ...). Repeatable' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l alloc-conf -d 'Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax instead of the workload\'s (e.g. "expandable_segments:True")' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l report -d 'Extra reports: `fragmentation` (per pool and segment, with fill maps, at the peak, at an out-of-memory and at the end, and over the run), `leaks` (also say why none were looked for), `all`. Comma-separated or repeated' -r -f -a "fragmentation\t''
leaks\t''
all\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l by -d 'Print a table like PyTorch profiler\'s `key_averages().table()`: per op (`op`), per module scope (`module`) or per phase (`annotation`), the allocations made and freed under it, the net, the largest single allocation and the bytes it held at the peak; after the verdict, instead of the report. With --json: a `profile` key with every row' -r -f -a "op\t'The op that allocated (a snapshot: its innermost aten op, else Python function)'
module\t'The module (gpumem\'s scope; a snapshot: the chain of lines that called nn.Modules)'
line\t'A snapshot\'s innermost Python line outside PyTorch and Python\'s standard library'
annotation\t'A snapshot\'s innermost record_function range open at the time (gpumem\'s runs: the phase)'"
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l sort -d 'The --by table\'s order, largest first: `peak` (bytes held at the peak, the default), `allocated`, `freed`, `net` (the profiler\'s "Self CUDA Mem"), `largest`, `allocs`' -r -f -a "peak\t''
allocated\t''
freed\t''
net\t''
largest\t''
allocs\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l top -d 'Rows of the --by table to print (--json gives them all)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l plot -d 'Write the memory timeline (allocated by category, stacked; reserved; iterations; the peak) as an SVG picture to FILE' -r -F
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l fail-on -d 'Exit 1 when the run finds one of these: `oom`, `leak` (comma-separated)' -r -f -a "oom\t''
leak\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l color -d 'Colour in the output: `auto` (on a terminal, unless NO_COLOR is set), `always`, `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l gradient-checkpointing -d 'With a bare config: checkpoint every decoder layer (`[model] gradient_checkpointing`)'
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l ddp -d 'With a bare config: train inside DistributedDataParallel (`[distributed] strategy = "ddp"`, world size 1): its broadcast at construction and its gradient buckets'
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l fsdp2 -d 'With a bare config: train under FSDP2 (`[distributed] strategy = "fsdp2"`, world size 1): `fully_shard` on each decoder layer, then the root; each group unsharded for its forward and backward, its gradients reduce-scattered into the shards'
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l no-reshard-after-forward -d 'With --fsdp2: keep each layer\'s parameters unsharded from its forward to its backward (`reshard_after_forward=False`)'
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l cpu-offload -d 'With --fsdp2: `CPUOffloadPolicy(pin_memory=True)`: the shards, their gradients and the optimizer\'s step on the host. With --zero: DeepSpeed\'s `offload_optimizer` to the CPU (pinned): the float32 master, its gradient and Adam\'s state on the host, DeepSpeedCPUAdam stepping there'
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -s q -l quiet -d 'Print only the verdict line (fits, or does not and by how much) and errors'
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l json -d 'Print one JSON object (iterations, marks, peak breakdown, memory_stats, oom)'
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l torch-style -d 'With the text output: PyTorch\'s memory_summary() text instead of the table'
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -l no-remedies -d 'On an out-of-memory, diagnose it but do not run the remedies'
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -s v -l verbose -d 'Log what the reader, the runner and the allocator do on stderr: -v for each file, iteration and segment (debug), -vv also every op (trace). RUST_LOG overrides it'
complete -c gpumem -n "__fish_gpumem_using_subcommand run" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpumem -n "__fish_gpumem_using_subcommand summary" -l device -d 'Show only this device (the N of cuda:N) of a snapshot that holds several' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand summary" -l iteration-marker -d 'Iterations are the calls of this function (e.g. train_step, or train.py:42): one starts at each allocation made inside a call, after allocations made outside. Beats the Optimizer.step annotations and repetition; for traces that have neither' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand summary" -l top -d 'How many sites (or --by rows) to list [default: 10]; one snapshot only' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand summary" -l capacity -d 'With several files (one per rank): the ranks whose peak reserved memory exceeds this capacity ("80GiB"; GB is read as GiB), and the rank that runs out first as memory shrinks (the highest peak reserved). Reserved memory only: NCCL\'s buffers and the CUDA context come on top' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand summary" -l by -d 'Print a table like PyTorch profiler\'s `key_averages().table()` for one snapshot: per `op` (innermost aten op, else Python function), `module` (the chain of lines that called nn.Modules), `line` (the innermost line outside PyTorch and Python\'s standard library: your model\'s or script\'s) or `annotation` (record_function ranges), the allocations made and freed under it, the net, the largest single allocation and the bytes it held at the peak; --top rows, after the verdict, instead of the report. With --json: a `profiles` key (one per device) with every row' -r -f -a "op\t'The op that allocated (a snapshot: its innermost aten op, else Python function)'
module\t'The module (gpumem\'s scope; a snapshot: the chain of lines that called nn.Modules)'
line\t'A snapshot\'s innermost Python line outside PyTorch and Python\'s standard library'
annotation\t'A snapshot\'s innermost record_function range open at the time (gpumem\'s runs: the phase)'"
complete -c gpumem -n "__fish_gpumem_using_subcommand summary" -l sort -d 'The --by table\'s order, largest first: `peak` (bytes held at the peak, the default), `allocated`, `freed`, `net` (the profiler\'s "Self CUDA Mem"), `largest`, `allocs`' -r -f -a "peak\t''
allocated\t''
freed\t''
net\t''
largest\t''
allocs\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand summary" -l fail-on -d 'Exit 1 when the snapshot shows one of these: `oom`, `leak`' -r -f -a "oom\t''
leak\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand summary" -l color -d 'Colour in the output: `auto` (on a terminal, unless NO_COLOR is set), `always`, `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand summary" -s q -l quiet -d 'Print only the verdict line (an out-of-memory and where, or the peak) and errors'
complete -c gpumem -n "__fish_gpumem_using_subcommand summary" -l stacks -d 'Show whole call stacks, C++ frames included; one snapshot only'
complete -c gpumem -n "__fish_gpumem_using_subcommand summary" -l json -d 'Print JSON (reserved_bytes, allocated_bytes, segments, peak_allocated_bytes, leaks, ...)'
complete -c gpumem -n "__fish_gpumem_using_subcommand summary" -s v -l verbose -d 'Log what the reader, the runner and the allocator do on stderr: -v for each file, iteration and segment (debug), -vv also every op (trace). RUST_LOG overrides it'
complete -c gpumem -n "__fish_gpumem_using_subcommand summary" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l batch -d 'The batch size (a preset\'s or config\'s `batch`, a script\'s `batch` parameter): the same as `--param batch=N`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l seq -d 'Tokens per sample (a config\'s or GPT preset\'s `seq`): the same as `--param seq=N`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l optimizer -d 'With a bare config: the optimizer (`[train] optimizer`)' -r -f -a "sgd\t''
sgd_momentum\t''
adam\t''
adamw\t''
adam8bit\t''
adamw8bit\t''
paged_adamw8bit\t''
torchao_adam8bit\t''
torchao_adamw8bit\t''
torchao_adam4bit\t''
torchao_adamw4bit\t''
none\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l precision -d 'With a bare config: `fp32` or `bf16-autocast` (`[train] precision`)' -r -f -a "fp32\t''
bf16-autocast\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l mode -d 'With a bare config: `train`, `inference` for a no-grad forward, or `generate` for `model.generate` of --new-tokens tokens after a --seq prompt (`[train] mode`)' -r -f -a "train\t''
inference\t''
generate\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l new-tokens -d 'Tokens `model.generate` makes after the prompt (a config\'s `[generate] new_tokens`): the same as `--param new_tokens=N`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l dtype -d 'With a bare config: the weights\' dtype, `fp32` or `bf16` (`[model] dtype`)' -r -f -a "fp32\t''
bf16\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l attention -d 'With a bare config: `sdpa` or `eager` (`[model] attention`)' -r -f -a "sdpa\t''
eager\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l lora-r -d 'With a bare config: peft\'s LoRA of rank R (`[model.lora] r`); --lora-alpha, --lora-dropout and --lora-targets set the rest (peft\'s defaults: alpha 8, dropout 0, q_proj,v_proj)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l lora-alpha -d 'With --lora-r: `[model.lora] alpha`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l lora-dropout -d 'With --lora-r: `[model.lora] dropout`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l lora-targets -d 'With --lora-r: the targeted linears, comma-separated (`[model.lora] target_modules`), or `all-linear` (peft\'s: every linear of the layers) or `attention` (the attention\'s projections: q_proj,k_proj,v_proj,o_proj, or Phi-3\'s qkv_proj,o_proj). Default: peft\'s for the model type (q_proj,v_proj; Phi-3\'s qkv_proj)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l bucket-cap-mb -d 'With --ddp: `[distributed] bucket_cap_mb` (PyTorch\'s default 25)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l zero -d 'With a bare config: train under DeepSpeed ZeRO stage 1, 2 or 3 (`[distributed] strategy = "zero1"`, `"zero2"` or `"zero3"`): the flat parameters, a float32 master partition and Adam\'s state per rank, the reduction bucket (`reduce_bucket_size`, 5e8 elements) and the partition\'s gradients, as DeepSpeed 0.19.6 allocates them. Rank 0 is shown. Stage 3 is modelled at world size 1 only' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l reduce-bucket-size -d 'With --zero: DeepSpeed\'s `reduce_bucket_size` in elements (default 500000000)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l world-size -d 'With --ddp, --fsdp2 or --zero: the number of ranks (`[distributed] world_size`, default 1). Every rank holds what rank 0 holds; under FSDP2 each a 1/N shard, the model built on the meta device when N > 1' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l param-dtype -d 'With --fsdp2: `MixedPrecisionPolicy(param_dtype=...)`: fp32 (none, the default) or bf16 (then give --reduce-dtype fp32)' -r -f -a "fp32\t''
bf16\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l reduce-dtype -d 'With --fsdp2: `MixedPrecisionPolicy(reduce_dtype=...)`: fp32 or bf16 (the default: param_dtype)' -r -f -a "fp32\t''
bf16\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l device -d 'Run workloads on this device instead of the workload\'s: `sim` (the default), `cpu`, `cuda` (the GPU\'s segments, the ops computed there) or `cuda-memory` (the GPU\'s segments only); see `gpumem run --help`' -r -f -a "sim\t''
cpu\t''
cuda\t''
cuda-memory\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l baseline -d 'The baseline file (JSON). Without --update (or --allow-new) it must exist. Without --baseline only budgets are checked (--budget, or the workload\'s [check] table)' -r -F
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l tolerance -d 'A tolerance: `2%` for every metric, or METRIC=PERCENT for one (e.g. peak_reserved=1%). Repeatable; beats the workload\'s [check] table and the baseline\'s settings' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l budget -d 'A budget: METRIC=SIZE (e.g. peak_reserved=20GiB or peak_allocated=1073741824). At the budget passes, one byte over fails. Repeatable' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l param -d 'Set a workload\'s integer parameter for this check (e.g. batch=64), as `gpumem run --param` does; applies to every workload given, each of which must have it. Repeatable' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l junit -d 'Also write JUnit XML to FILE (atomically): a <testcase classname="INPUT" name="METRIC"> per input and metric, with a <failure> in each that fails' -r -F
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l top -d 'How many categories and tag stacks to list under each regression' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l color -d 'Colour in the output: `auto` (on a terminal, unless NO_COLOR is set), `always`, `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l gradient-checkpointing -d 'With a bare config: checkpoint every decoder layer (`[model] gradient_checkpointing`)'
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l ddp -d 'With a bare config: train inside DistributedDataParallel (`[distributed] strategy = "ddp"`, world size 1): its broadcast at construction and its gradient buckets'
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l fsdp2 -d 'With a bare config: train under FSDP2 (`[distributed] strategy = "fsdp2"`, world size 1): `fully_shard` on each decoder layer, then the root; each group unsharded for its forward and backward, its gradients reduce-scattered into the shards'
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l no-reshard-after-forward -d 'With --fsdp2: keep each layer\'s parameters unsharded from its forward to its backward (`reshard_after_forward=False`)'
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l cpu-offload -d 'With --fsdp2: `CPUOffloadPolicy(pin_memory=True)`: the shards, their gradients and the optimizer\'s step on the host. With --zero: DeepSpeed\'s `offload_optimizer` to the CPU (pinned): the float32 master, its gradient and Adam\'s state on the host, DeepSpeedCPUAdam stepping there'
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -s q -l quiet -d 'Print only the verdict line (passed, or what failed) and errors'
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l update -d 'Write the baseline instead of checking: record every input\'s metrics (creating the file if needed), keep other entries and every entry\'s "check" settings; exit 0. (Tolerances and budgets are set in the workload\'s [check] table or the entry\'s "check" object, not recorded from the command line.)'
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l allow-new -d 'Pass inputs that have no baseline entry (reported as new) instead of failing them'
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l markdown -d 'Print the report as markdown (for a pull-request comment) instead of the table'
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -l json -d 'Print JSON (every row with its verdict, limit and what grew) instead of the table'
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -s v -l verbose -d 'Log what the reader, the runner and the allocator do on stderr: -v for each file, iteration and segment (debug), -vv also every op (trace). RUST_LOG overrides it'
complete -c gpumem -n "__fish_gpumem_using_subcommand check" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpumem -n "__fish_gpumem_using_subcommand export" -l to -d 'The format to write' -r -f -a "memory-viz\t'PyTorch\'s snapshot pickle (memory_viz)'
torch-json\t'PyTorch\'s snapshot dict as JSON'
perfetto\t'A Chrome/Perfetto trace with memory counters'"
complete -c gpumem -n "__fish_gpumem_using_subcommand export" -s o -l output -d 'Where to write it (atomically); a name ending in `.gz` is written compressed with gzip (torch-json and perfetto)' -r -F
complete -c gpumem -n "__fish_gpumem_using_subcommand export" -l color -d 'Colour in the output: `auto` (on a terminal, unless NO_COLOR is set), `always`, `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand export" -s v -l verbose -d 'Log what the reader, the runner and the allocator do on stderr: -v for each file, iteration and segment (debug), -vv also every op (trace). RUST_LOG overrides it'
complete -c gpumem -n "__fish_gpumem_using_subcommand export" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l batch -d 'The batch size (a preset\'s or config\'s `batch`, a script\'s `batch` parameter): the same as `--param batch=N`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l seq -d 'Tokens per sample (a config\'s or GPT preset\'s `seq`): the same as `--param seq=N`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l optimizer -d 'With a bare config: the optimizer (`[train] optimizer`)' -r -f -a "sgd\t''
sgd_momentum\t''
adam\t''
adamw\t''
adam8bit\t''
adamw8bit\t''
paged_adamw8bit\t''
torchao_adam8bit\t''
torchao_adamw8bit\t''
torchao_adam4bit\t''
torchao_adamw4bit\t''
none\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l precision -d 'With a bare config: `fp32` or `bf16-autocast` (`[train] precision`)' -r -f -a "fp32\t''
bf16-autocast\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l mode -d 'With a bare config: `train`, `inference` for a no-grad forward, or `generate` for `model.generate` of --new-tokens tokens after a --seq prompt (`[train] mode`)' -r -f -a "train\t''
inference\t''
generate\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l new-tokens -d 'Tokens `model.generate` makes after the prompt (a config\'s `[generate] new_tokens`): the same as `--param new_tokens=N`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l dtype -d 'With a bare config: the weights\' dtype, `fp32` or `bf16` (`[model] dtype`)' -r -f -a "fp32\t''
bf16\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l attention -d 'With a bare config: `sdpa` or `eager` (`[model] attention`)' -r -f -a "sdpa\t''
eager\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l lora-r -d 'With a bare config: peft\'s LoRA of rank R (`[model.lora] r`); --lora-alpha, --lora-dropout and --lora-targets set the rest (peft\'s defaults: alpha 8, dropout 0, q_proj,v_proj)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l lora-alpha -d 'With --lora-r: `[model.lora] alpha`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l lora-dropout -d 'With --lora-r: `[model.lora] dropout`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l lora-targets -d 'With --lora-r: the targeted linears, comma-separated (`[model.lora] target_modules`), or `all-linear` (peft\'s: every linear of the layers) or `attention` (the attention\'s projections: q_proj,k_proj,v_proj,o_proj, or Phi-3\'s qkv_proj,o_proj). Default: peft\'s for the model type (q_proj,v_proj; Phi-3\'s qkv_proj)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l bucket-cap-mb -d 'With --ddp: `[distributed] bucket_cap_mb` (PyTorch\'s default 25)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l zero -d 'With a bare config: train under DeepSpeed ZeRO stage 1, 2 or 3 (`[distributed] strategy = "zero1"`, `"zero2"` or `"zero3"`): the flat parameters, a float32 master partition and Adam\'s state per rank, the reduction bucket (`reduce_bucket_size`, 5e8 elements) and the partition\'s gradients, as DeepSpeed 0.19.6 allocates them. Rank 0 is shown. Stage 3 is modelled at world size 1 only' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l reduce-bucket-size -d 'With --zero: DeepSpeed\'s `reduce_bucket_size` in elements (default 500000000)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l world-size -d 'With --ddp, --fsdp2 or --zero: the number of ranks (`[distributed] world_size`, default 1). Every rank holds what rank 0 holds; under FSDP2 each a 1/N shard, the model built on the meta device when N > 1' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l param-dtype -d 'With --fsdp2: `MixedPrecisionPolicy(param_dtype=...)`: fp32 (none, the default) or bf16 (then give --reduce-dtype fp32)' -r -f -a "fp32\t''
bf16\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l reduce-dtype -d 'With --fsdp2: `MixedPrecisionPolicy(reduce_dtype=...)`: fp32 or bf16 (the default: param_dtype)' -r -f -a "fp32\t''
bf16\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l top -d 'How many sites to list' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l device -d 'For a snapshot of several GPUs: the device to show (the N of cuda:N; default: the one with the longest trace)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l color -d 'Colour in the output: `auto` (on a terminal, unless NO_COLOR is set), `always`, `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l gradient-checkpointing -d 'With a bare config: checkpoint every decoder layer (`[model] gradient_checkpointing`)'
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l ddp -d 'With a bare config: train inside DistributedDataParallel (`[distributed] strategy = "ddp"`, world size 1): its broadcast at construction and its gradient buckets'
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l fsdp2 -d 'With a bare config: train under FSDP2 (`[distributed] strategy = "fsdp2"`, world size 1): `fully_shard` on each decoder layer, then the root; each group unsharded for its forward and backward, its gradients reduce-scattered into the shards'
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l no-reshard-after-forward -d 'With --fsdp2: keep each layer\'s parameters unsharded from its forward to its backward (`reshard_after_forward=False`)'
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l cpu-offload -d 'With --fsdp2: `CPUOffloadPolicy(pin_memory=True)`: the shards, their gradients and the optimizer\'s step on the host. With --zero: DeepSpeed\'s `offload_optimizer` to the CPU (pinned): the float32 master, its gradient and Adam\'s state on the host, DeepSpeedCPUAdam stepping there'
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l markdown -d 'Print markdown tables (for a pull-request comment)'
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -l json -d 'Print JSON'
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -s v -l verbose -d 'Log what the reader, the runner and the allocator do on stderr: -v for each file, iteration and segment (debug), -vv also every op (trace). RUST_LOG overrides it'
complete -c gpumem -n "__fish_gpumem_using_subcommand diff" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l preset -d 'A workload built into gpumem instead of a file (they are listed below); `preset:NAME` works as a workload path too' -r -f -a "gpt2-small\t'GPT-2 small (124M) trained with AdamW, batch 8 x 1024 tokens (PyTorch\'s figures to the byte)'
mlp-adam\t'an MLP trained with Adam'
mlp-leak\t'an MLP whose loop keeps every loss with its graph: a leak'
fragmentation-oom\t'an out-of-memory from fragmentation that expandable segments fix'
capacity-oom\t'an out-of-memory from capacity: Adam\'s state does not fit a 2 GiB card'"
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l batch -d 'The batch size (a preset\'s or config\'s `batch`, a script\'s `batch` parameter): the same as `--param batch=N`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l seq -d 'Tokens per sample (a config\'s or GPT preset\'s `seq`): the same as `--param seq=N`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l optimizer -d 'With a bare config: the optimizer (`[train] optimizer`)' -r -f -a "sgd\t''
sgd_momentum\t''
adam\t''
adamw\t''
adam8bit\t''
adamw8bit\t''
paged_adamw8bit\t''
torchao_adam8bit\t''
torchao_adamw8bit\t''
torchao_adam4bit\t''
torchao_adamw4bit\t''
none\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l precision -d 'With a bare config: `fp32` or `bf16-autocast` (`[train] precision`)' -r -f -a "fp32\t''
bf16-autocast\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l mode -d 'With a bare config: `train`, `inference` for a no-grad forward, or `generate` for `model.generate` of --new-tokens tokens after a --seq prompt (`[train] mode`)' -r -f -a "train\t''
inference\t''
generate\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l new-tokens -d 'Tokens `model.generate` makes after the prompt (a config\'s `[generate] new_tokens`): the same as `--param new_tokens=N`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l dtype -d 'With a bare config: the weights\' dtype, `fp32` or `bf16` (`[model] dtype`)' -r -f -a "fp32\t''
bf16\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l attention -d 'With a bare config: `sdpa` or `eager` (`[model] attention`)' -r -f -a "sdpa\t''
eager\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l lora-r -d 'With a bare config: peft\'s LoRA of rank R (`[model.lora] r`); --lora-alpha, --lora-dropout and --lora-targets set the rest (peft\'s defaults: alpha 8, dropout 0, q_proj,v_proj)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l lora-alpha -d 'With --lora-r: `[model.lora] alpha`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l lora-dropout -d 'With --lora-r: `[model.lora] dropout`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l lora-targets -d 'With --lora-r: the targeted linears, comma-separated (`[model.lora] target_modules`), or `all-linear` (peft\'s: every linear of the layers) or `attention` (the attention\'s projections: q_proj,k_proj,v_proj,o_proj, or Phi-3\'s qkv_proj,o_proj). Default: peft\'s for the model type (q_proj,v_proj; Phi-3\'s qkv_proj)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l bucket-cap-mb -d 'With --ddp: `[distributed] bucket_cap_mb` (PyTorch\'s default 25)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l zero -d 'With a bare config: train under DeepSpeed ZeRO stage 1, 2 or 3 (`[distributed] strategy = "zero1"`, `"zero2"` or `"zero3"`): the flat parameters, a float32 master partition and Adam\'s state per rank, the reduction bucket (`reduce_bucket_size`, 5e8 elements) and the partition\'s gradients, as DeepSpeed 0.19.6 allocates them. Rank 0 is shown. Stage 3 is modelled at world size 1 only' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l reduce-bucket-size -d 'With --zero: DeepSpeed\'s `reduce_bucket_size` in elements (default 500000000)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l world-size -d 'With --ddp, --fsdp2 or --zero: the number of ranks (`[distributed] world_size`, default 1). Every rank holds what rank 0 holds; under FSDP2 each a 1/N shard, the model built on the meta device when N > 1' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l param-dtype -d 'With --fsdp2: `MixedPrecisionPolicy(param_dtype=...)`: fp32 (none, the default) or bf16 (then give --reduce-dtype fp32)' -r -f -a "fp32\t''
bf16\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l reduce-dtype -d 'With --fsdp2: `MixedPrecisionPolicy(reduce_dtype=...)`: fp32 or bf16 (the default: param_dtype)' -r -f -a "fp32\t''
bf16\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l device -d 'Run every trial on this device instead of the simulated one: `sim` (the default), `cpu`, `cuda` (the GPU\'s segments, every trial computed there: slow) or `cuda-memory` (the GPU\'s segments only, the figures of `cuda`); see `gpumem run --help`' -r -f -a "sim\t''
cpu\t''
cuda\t''
cuda-memory\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l capacity -d 'The device\'s memory (e.g. 24GiB; GB is read as GiB); default: the workload\'s capacity, or 80 GiB' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l param -d 'The integer parameter to search (default: batch, or batch_size)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l max -d 'The largest value to try (default 65536; for `--param new_tokens`, what is left of the model\'s max_position_embeddings after the prompt)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l iterations -d 'Iterations of each run instead of the workload\'s (fewer is faster; a leak needs more)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l color -d 'Colour in the output: `auto` (on a terminal, unless NO_COLOR is set), `always`, `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l gradient-checkpointing -d 'With a bare config: checkpoint every decoder layer (`[model] gradient_checkpointing`)'
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l ddp -d 'With a bare config: train inside DistributedDataParallel (`[distributed] strategy = "ddp"`, world size 1): its broadcast at construction and its gradient buckets'
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l fsdp2 -d 'With a bare config: train under FSDP2 (`[distributed] strategy = "fsdp2"`, world size 1): `fully_shard` on each decoder layer, then the root; each group unsharded for its forward and backward, its gradients reduce-scattered into the shards'
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l no-reshard-after-forward -d 'With --fsdp2: keep each layer\'s parameters unsharded from its forward to its backward (`reshard_after_forward=False`)'
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l cpu-offload -d 'With --fsdp2: `CPUOffloadPolicy(pin_memory=True)`: the shards, their gradients and the optimizer\'s step on the host. With --zero: DeepSpeed\'s `offload_optimizer` to the CPU (pinned): the float32 master, its gradient and Adam\'s state on the host, DeepSpeedCPUAdam stepping there'
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -s q -l quiet -d 'Print only the verdict line and errors'
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l no-remedies -d 'Only the workload as it is, no remedies'
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l exact -d 'With `--param new_tokens`: always simulate to the boundary, however long that takes. By default the simulation stops after a few seconds: with one generation per run (`--iterations 1`) the answer is then a lower bound, marked "at least", with the KV cache\'s estimate beside it; over several iterations (a later one may run out where the first fits) it is that estimate alone, marked "about", which leaves out the allocator\'s slack and may be a few percent off (Llama-3.1-8B on 24 GiB: about 67,671 where 66,049 is exact; Qwen2.5-0.5B at batch 64 on 8 GiB: about 6,803 where 6,913 is). About 100 us per generated token for a 7B model at batch 1 on a 2-core machine: 91,649 tokens on 20 GiB in 9 s with --iterations 1 -q (each remedy\'s search costs as much again)'
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -l json -d 'Print JSON: `max_fitting` per remedy, with the peaks at that value'
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -s v -l verbose -d 'Log what the reader, the runner and the allocator do on stderr: -v for each file, iteration and segment (debug), -vv also every op (trace). RUST_LOG overrides it'
complete -c gpumem -n "__fish_gpumem_using_subcommand fit" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpumem -n "__fish_gpumem_using_subcommand plot" -s o -l output -d 'Where to write the SVG' -r -F
complete -c gpumem -n "__fish_gpumem_using_subcommand plot" -l samples -d 'Points kept along the x axis: each is the highest memory of its stretch of events, so spikes such as the peak stay visible' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand plot" -l device -d 'For a snapshot of several GPUs: the device to show (the N of cuda:N; default: the one with the longest trace)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand plot" -l iteration-marker -d 'For a PyTorch snapshot: iterations are the calls of this function (as in `gpumem summary --iteration-marker`), marked on the time axis' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand plot" -l color -d 'Colour in the output: `auto` (on a terminal, unless NO_COLOR is set), `always`, `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand plot" -s v -l verbose -d 'Log what the reader, the runner and the allocator do on stderr: -v for each file, iteration and segment (debug), -vv also every op (trace). RUST_LOG overrides it'
complete -c gpumem -n "__fish_gpumem_using_subcommand plot" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpumem -n "__fish_gpumem_using_subcommand replay" -l alloc-conf -d 'Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax, instead of the trace\'s (e.g. "expandable_segments:True" or "max_split_size_mb:128,roundup_power2_divisions:4"). Differences from the recording are then what the setting changes' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand replay" -l max-mismatches -d 'How many mismatching steps to show in detail' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand replay" -l capacity -d 'For a snapshot: what the allocator may use (e.g. 79GiB). Default: the gpumem snapshot\'s device, or what a PyTorch trace\'s out-of-memory entries show' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand replay" -l device -d 'For a snapshot of several GPUs: the device to show (the N of cuda:N; default: the one with the longest trace)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand replay" -l color -d 'Colour in the output: `auto` (on a terminal, unless NO_COLOR is set), `always`, `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand replay" -l json -d 'Print one JSON object (ops, mismatched_steps, ooms_expected, ooms_matched, stats_end_mismatched_keys, memory_stats, ...) instead of text'
complete -c gpumem -n "__fish_gpumem_using_subcommand replay" -l summary -d 'End with the allocator\'s final state as a memory_summary table'
complete -c gpumem -n "__fish_gpumem_using_subcommand replay" -l torch-style -d 'With --summary: print PyTorch\'s memory_summary() text exactly, to diff against PyTorch'
complete -c gpumem -n "__fish_gpumem_using_subcommand replay" -l no-trace-addresses -d 'Use the simulator\'s own segment addresses (its model of the CUDA driver\'s address space) instead of the trace\'s; the event trace is then compared without addresses'
complete -c gpumem -n "__fish_gpumem_using_subcommand replay" -s v -l verbose -d 'Log what the reader, the runner and the allocator do on stderr: -v for each file, iteration and segment (debug), -vv also every op (trace). RUST_LOG overrides it'
complete -c gpumem -n "__fish_gpumem_using_subcommand replay" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpumem -n "__fish_gpumem_using_subcommand bench" -l device -d 'With --workload: run it on this device instead of the workload\'s: `sim` (the default), `cpu`, `cuda` (the GPU\'s segments, the ops computed there) or `cuda-memory` (the GPU\'s segments only); see `gpumem run --help`' -r -f -a "sim\t''
cpu\t''
cuda\t''
cuda-memory\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand bench" -l repeat -d 'Repetitions of each pattern (each is timed; the median is reported), 1 to 100' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand bench" -l pairs-reps -d 'Passes over the size list per `pairs` repetition (at most 100,000)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand bench" -l batch-reps -d 'Passes over the size list per `batch` repetition (at most 100,000)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand bench" -l warmup-ms -d 'Milliseconds of untimed work first, so the CPU is at speed when timing starts (at most 60000)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand bench" -l pytorch -d 'PyTorch\'s results (JSON, as above) to compare against; its size lists are used' -r -F
complete -c gpumem -n "__fish_gpumem_using_subcommand bench" -l workload -d 'Time running this workload instead (ms per iteration and allocator events per iteration, over --repeat runs of its setup and iterations)' -r -F
complete -c gpumem -n "__fish_gpumem_using_subcommand bench" -l color -d 'Colour in the output: `auto` (on a terminal, unless NO_COLOR is set), `always`, `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand bench" -l json -d 'Print JSON instead of a table'
complete -c gpumem -n "__fish_gpumem_using_subcommand bench" -s v -l verbose -d 'Log what the reader, the runner and the allocator do on stderr: -v for each file, iteration and segment (debug), -vv also every op (trace). RUST_LOG overrides it'
complete -c gpumem -n "__fish_gpumem_using_subcommand bench" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpumem -n "__fish_gpumem_using_subcommand compare-torch" -l case -d 'Only this case (repeatable)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand compare-torch" -l capacity -d 'The simulated device\'s capacity (default: 80GiB)' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand compare-torch" -l color -d 'Colour in the output: `auto` (on a terminal, unless NO_COLOR is set), `always`, `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand compare-torch" -l json -d 'Print JSON (every field of every iteration) instead of the table'
complete -c gpumem -n "__fish_gpumem_using_subcommand compare-torch" -s v -l verbose -d 'Log what the reader, the runner and the allocator do on stderr: -v for each file, iteration and segment (debug), -vv also every op (trace). RUST_LOG overrides it'
complete -c gpumem -n "__fish_gpumem_using_subcommand compare-torch" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpumem -n "__fish_gpumem_using_subcommand devices" -l color -d 'Colour in the output: `auto` (on a terminal, unless NO_COLOR is set), `always`, `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand devices" -l json -d 'Print JSON (driver_version, cuda_version, gpus with memory and processes)'
complete -c gpumem -n "__fish_gpumem_using_subcommand devices" -s v -l verbose -d 'Log what the reader, the runner and the allocator do on stderr: -v for each file, iteration and segment (debug), -vv also every op (trace). RUST_LOG overrides it'
complete -c gpumem -n "__fish_gpumem_using_subcommand devices" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpumem -n "__fish_gpumem_using_subcommand selftest" -l device -d 'The device whose kernels to check: `cuda`' -r
complete -c gpumem -n "__fish_gpumem_using_subcommand selftest" -l color -d 'Colour in the output: `auto` (on a terminal, unless NO_COLOR is set), `always`, `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand selftest" -l json -d 'Print JSON (the GPU, and each check\'s op, case, dtype, values, elements, max_rel_error, worst, tolerance, ok, gpu_launches, host_launches and host_kernels)'
complete -c gpumem -n "__fish_gpumem_using_subcommand selftest" -s v -l verbose -d 'Log what the reader, the runner and the allocator do on stderr: -v for each file, iteration and segment (debug), -vv also every op (trace). RUST_LOG overrides it'
complete -c gpumem -n "__fish_gpumem_using_subcommand selftest" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpumem -n "__fish_gpumem_using_subcommand completions" -l color -d 'Colour in the output: `auto` (on a terminal, unless NO_COLOR is set), `always`, `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand completions" -s v -l verbose -d 'Log what the reader, the runner and the allocator do on stderr: -v for each file, iteration and segment (debug), -vv also every op (trace). RUST_LOG overrides it'
complete -c gpumem -n "__fish_gpumem_using_subcommand completions" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpumem -n "__fish_gpumem_using_subcommand mcp" -l color -d 'Colour in the output: `auto` (on a terminal, unless NO_COLOR is set), `always`, `never`' -r -f -a "auto\t''
always\t''
never\t''"
complete -c gpumem -n "__fish_gpumem_using_subcommand mcp" -s v -l verbose -d 'Log what the reader, the runner and the allocator do on stderr: -v for each file, iteration and segment (debug), -vv also every op (trace). RUST_LOG overrides it'
complete -c gpumem -n "__fish_gpumem_using_subcommand mcp" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpumem -n "__fish_gpumem_using_subcommand help; and not __fish_seen_subcommand_from run summary check export diff fit plot replay bench compare-torch devices selftest completions mcp help" -f -a "run" -d 'Run a workload on the simulated device and show where the memory went'
complete -c gpumem -n "__fish_gpumem_using_subcommand help; and not __fish_seen_subcommand_from run summary check export diff fit plot replay bench compare-torch devices selftest completions mcp help" -f -a "summary" -d 'Summarize a memory snapshot: gpumem\'s, or one PyTorch wrote.'
complete -c gpumem -n "__fish_gpumem_using_subcommand help; and not __fish_seen_subcommand_from run summary check export diff fit plot replay bench compare-torch devices selftest completions mcp help" -f -a "check" -d 'Fail CI when peak memory regresses: workloads run on the simulated device (no GPU needed) against a committed baseline.'
complete -c gpumem -n "__fish_gpumem_using_subcommand help; and not __fish_seen_subcommand_from run summary check export diff fit plot replay bench compare-torch devices selftest completions mcp help" -f -a "export" -d 'Write a snapshot in another tool\'s format.'
complete -c gpumem -n "__fish_gpumem_using_subcommand help; and not __fish_seen_subcommand_from run summary check export diff fit plot replay bench compare-torch devices selftest completions mcp help" -f -a "diff" -d 'Compare two snapshots or runs: peaks, categories, allocation sites, segments.'
complete -c gpumem -n "__fish_gpumem_using_subcommand help; and not __fish_seen_subcommand_from run summary check export diff fit plot replay bench compare-torch devices selftest completions mcp help" -f -a "fit" -d 'Find the largest batch size (or another integer parameter) that fits on a device.'
complete -c gpumem -n "__fish_gpumem_using_subcommand help; and not __fish_seen_subcommand_from run summary check export diff fit plot replay bench compare-torch devices selftest completions mcp help" -f -a "plot" -d 'Draw the memory timeline of a snapshot as an SVG picture.'
complete -c gpumem -n "__fish_gpumem_using_subcommand help; and not __fish_seen_subcommand_from run summary check export diff fit plot replay bench compare-torch devices selftest completions mcp help" -f -a "replay" -d 'Replay a PyTorch allocator trace step by step, or a snapshot\'s allocations under other allocator settings ("would this have saved my run?").'
complete -c gpumem -n "__fish_gpumem_using_subcommand help; and not __fish_seen_subcommand_from run summary check export diff fit plot replay bench compare-torch devices selftest completions mcp help" -f -a "bench" -d 'Measure the allocator: ns per alloc+free pair with event recording on and off.'
complete -c gpumem -n "__fish_gpumem_using_subcommand help; and not __fish_seen_subcommand_from run summary check export diff fit plot replay bench compare-torch devices selftest completions mcp help" -f -a "compare-torch" -d 'Check gpumem\'s model presets against PyTorch: every recorded case, each iteration\'s figures.'
complete -c gpumem -n "__fish_gpumem_using_subcommand help; and not __fish_seen_subcommand_from run summary check export diff fit plot replay bench compare-torch devices selftest completions mcp help" -f -a "devices" -d 'List this machine\'s NVIDIA GPUs: memory total, used and free, driver and CUDA versions, and the processes holding memory.'
complete -c gpumem -n "__fish_gpumem_using_subcommand help; and not __fish_seen_subcommand_from run summary check export diff fit plot replay bench compare-torch devices selftest completions mcp help" -f -a "selftest" -d 'Check `--device cuda` against `--device cpu`, op by op, forward and backward, in float32 and bf16.'
complete -c gpumem -n "__fish_gpumem_using_subcommand help; and not __fish_seen_subcommand_from run summary check export diff fit plot replay bench compare-torch devices selftest completions mcp help" -f -a "completions" -d 'Print a shell completion script for gpumem: every command, flag and value.'
complete -c gpumem -n "__fish_gpumem_using_subcommand help; and not __fish_seen_subcommand_from run summary check export diff fit plot replay bench compare-torch devices selftest completions mcp help" -f -a "mcp" -d 'Serve gpumem\'s answers to coding agents over the Model Context Protocol (stdio).'
complete -c gpumem -n "__fish_gpumem_using_subcommand help; and not __fish_seen_subcommand_from run summary check export diff fit plot replay bench compare-torch devices selftest completions mcp help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
