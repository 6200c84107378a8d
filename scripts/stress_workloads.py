#!/usr/bin/env python3
"""Stress test of gpumem's workload runner (`gpumem run W.toml`).

gpumem promises that on bad input it exits 2 with `gpumem: error: ...` naming the file (line,
key) or flag to fix, and that it never panics, hangs or uses unbounded memory. This script
generates inputs that try to break that promise and runs them one at a time:

1. random scripts in the workload language (tensor factories and ops with adversarial
   arguments, mixed with valid statements so that the runner gets deep into the engine);
2. mutations of every fixture workload (values of its keys replaced, keys removed or added,
   tables duplicated, script lines mutated) and of the Hugging Face config.json files the hf
   workloads read.

Each run: `nice -n 19`, a 20 s wall timeout, a 4 GiB address-space limit, NO_COLOR=1 and none
of PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF / RUST_LOG / GPUMEM_THREADS in the environment.
Failures (a panic, a signal, a timeout, the memory limit, an exit 2 that names nothing to fix,
any other exit code) are saved under OUT/fail/NNN/ (input, command, exit code, time, stderr
tail), deduplicated by panic location or message pattern, and shrunk (lines of the script, or
keys of the TOML) while the failure stays the same. OUT/summary.json and OUT/report.md give the
counts; OUT/exit2_messages.txt lists every distinct exit-2 message pattern (with an input) to
review by hand.

Deterministic given --seed (the inputs; timings of course vary). Standard library only.

    python3 scripts/stress_workloads.py target/release/gpumem --seed 1 --count 1500 --out /tmp/stress
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 20
MEM_LIMIT = 4 << 30
DROP_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "RUST_LOG", "GPUMEM_THREADS")

I64_MAX = 2**63 - 1
I64_MIN = -(2**63)

# --------------------------------------------------------------------------------------------
# Running one input
# --------------------------------------------------------------------------------------------


def _child_limits():
    os.nice(19)
    resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))


def child_env():
    env = {k: v for k, v in os.environ.items() if k not in DROP_ENV}
    env["NO_COLOR"] = "1"
    env["RUST_BACKTRACE"] = "1"
    return env


ENV = None


def run_gpumem(binary, argv, cwd, timeout=TIMEOUT_S):
    """Runs `binary argv...` in cwd; returns (rc, seconds, timed_out, stderr_tail, stdout_len)."""
    global ENV
    if ENV is None:
        ENV = child_env()
    err_path = Path(cwd) / ".stderr"
    out_path = Path(cwd) / ".stdout"
    t0 = time.monotonic()
    timed_out = False
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        p = subprocess.Popen(
            [binary] + argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=ENV,
            preexec_fn=_child_limits,
            start_new_session=True,
        )
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(p.pid, 9)  # the group of the process this script started
            except ProcessLookupError:
                pass
            rc = p.wait()
    dt = time.monotonic() - t0
    with open(err_path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - 16000))
        tail = f.read().decode("utf-8", "replace")
        f.seek(0)
        head = f.read(4000).decode("utf-8", "replace")
    if size > 16000:
        tail = head + "\n[... stderr cut ...]\n" + tail
    stdout_len = out_path.stat().st_size
    return rc, dt, timed_out, tail, stdout_len


# --------------------------------------------------------------------------------------------
# Classification
# --------------------------------------------------------------------------------------------

FLAG_RE = re.compile(r"--[a-z][a-z-]+")
LINE_RE = re.compile(r"\bline \d+")


def norm_msg(s):
    """A message pattern: numbers, quoted names and paths made generic."""
    s = s.strip()
    s = re.sub(r"/tmp/stress\S*", "PATH", s)
    s = re.sub(r"'[^']{0,200}'", "'…'", s)
    s = re.sub(r"`[^`]{0,200}`", "`…`", s)
    s = re.sub(r'"[^"]{0,200}"', '"…"', s)
    s = re.sub(r"-?\d[\d_.,e+]*", "N", s)
    s = re.sub(r"\[[N, ]*\]", "[N…]", s)
    return s[:240]


def first_error_line(stderr):
    for line in stderr.splitlines():
        if line.startswith("gpumem: error:") or line.startswith("error:"):
            return line
    lines = [l for l in stderr.splitlines() if l.strip()]
    return lines[0] if lines else ""


def classify(rc, timed_out, stderr, names):
    """('ok', kind) or ('fail', kind, dedup_key). names: strings whose mention makes an exit-2
    message helpful (file names, keys)."""
    if timed_out:
        return ("fail", "timeout", None)
    m = re.search(r"panicked at ([^\n]+?):(\d+):(\d+)", stderr)
    if m or "panicked" in stderr or rc == 101:
        msg = ""
        mm = re.search(r"panicked at [^\n]*\n([^\n]*)", stderr)
        if mm:
            msg = mm.group(1)
        loc = f"{m.group(1)}:{m.group(2)}" if m else "?"
        if "has overflowed its stack" in stderr:
            return ("fail", "stack-overflow", "stack overflow")
        return ("fail", "panic", f"panic {loc} {norm_msg(msg)[:80]}")
    if "has overflowed its stack" in stderr:
        return ("fail", "stack-overflow", "stack overflow")
    if "memory allocation of" in stderr or "capacity overflow" in stderr:
        return ("fail", "memory", None)
    if rc < 0:
        return ("fail", "signal", f"signal {-rc}")
    if rc in (0, 1):
        return ("ok", f"exit{rc}")
    if rc == 2:
        line = first_error_line(stderr)
        if not (line.startswith("gpumem: error:") or line.startswith("error:")):
            return ("fail", "exit2-format", "exit2 without 'gpumem: error:' " + norm_msg(line))
        if line.startswith("error:"):  # clap
            return ("ok", "exit2")
        full = stderr
        if LINE_RE.search(full) or FLAG_RE.search(full):
            return ("ok", "exit2")
        for n in names:
            if n and n in full:
                return ("ok", "exit2")
        return ("fail", "exit2-unhelpful", "exit2 unhelpful: " + norm_msg(line))
    if rc == 134:
        return ("fail", "signal", "abort 134")
    return ("fail", f"exit{rc}", f"exit {rc}")


# --------------------------------------------------------------------------------------------
# TOML writing
# --------------------------------------------------------------------------------------------

BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_key(k):
    return k if BARE_KEY.match(k) else json.dumps(k, ensure_ascii=False)


def toml_str(s):
    out = json.dumps(s, ensure_ascii=False)
    return out.replace("\x7f", "\\u007F")


def toml_multiline(s, rng=None):
    """A script as a multi-line basic string (or a literal one when it can be)."""
    if rng is not None and "'''" not in s and not any(ord(c) < 32 and c not in "\n\t" for c in s) \
            and rng.random() < 0.3:
        return "'''\n" + s + "\n'''"
    body = s.replace("\\", "\\\\").replace('"""', '""\\"')
    body = "".join(
        c if (ord(c) >= 32 or c in "\n\t") and c != "\x7f" else "\\u%04X" % ord(c) for c in body
    )
    return '"""\n' + body + '\n"""'


def toml_value(v, rng=None, script=False):
    if isinstance(v, RawToml):
        return v.text
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        r = repr(v)
        if "e" not in r and "." not in r:
            r += ".0"
        return r
    if isinstance(v, str):
        if script and "\n" in v:
            return toml_multiline(v, rng)
        return toml_str(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


class RawToml:
    """A value written as given (e.g. `nan`, `1e999`)."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return f"RawToml({self.text!r})"


class InlineTable(dict):
    """A table that must be written inline (a mutated value)."""


def toml_dump(doc, rng=None):
    lines = []

    def emit(table, path):
        scalars = [(k, v) for k, v in table.items() if not (type(v) is dict)]
        subs = [(k, v) for k, v in table.items() if type(v) is dict]
        if path:
            lines.append("[" + ".".join(toml_key(p) for p in path) + "]")
        for k, v in scalars:
            lines.append(f"{toml_key(k)} = {toml_value(v, rng, script=k in ('setup', 'body'))}")
        if path or scalars:
            lines.append("")
        for k, v in subs:
            emit(v, path + [k])

    emit(doc, [])
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Random scripts
# --------------------------------------------------------------------------------------------

FLOAT_DTYPES = ["float32", "bf16", "f16", "float64", "float", "half", "torch.float32"]
INT_DTYPES = ["int64", "int32", "int8", "uint8", "bool", "long"]
BAD_DTYPES = ["float8", '"bf16"', "x_undefined", "1", "none", "int4", "complex64", "torch.bf17",
              "[bf16]", "true", "f32.f32"]
ADV_INTS = ["0", "1", "-1", "-5", str(2**31), str(2**40), str(2**62), str(I64_MAX),
            "2**63", "-2**63", "-9223372036854775807 - 1", "9223372036854775807 + 1",
            "2**62 * 4", "2**32 * 2**32", "99999999999999999999", "1.5", "-0.0", "inf", "-inf",
            "1e308", "nan", "true", "none", '"3"', "[2, 3]", "[]", "2**-1", "1/0", "(-2)**0.5"]
SMALL = [1, 2, 3, 4, 5, 8, 16, 32, 64]
MEDIUM = [128, 256, 512, 1024, 4096]

UNARY = ["neg", "sin", "cos", "exp", "relu", "gelu", "silu", "sigmoid", "tanh", "rsqrt", "sqrt"]
BINARY = {"+": "add", "-": "sub", "*": "mul", "/": "div"}
COMPARE = ["le", "lt", "ge", "gt", "eq", "ne"]
INPLACE = ["add_", "sub_", "mul_", "div_", "fill_", "zero_", "copy_", "relu_", "sin_", "exp_", "neg_"]


class T:
    """What the generator believes about a tensor variable."""

    def __init__(self, shape, dtype="float32", rg=False, leaf=True):
        self.shape = shape  # a list of ints, or None when unknown
        self.dtype = dtype
        self.rg = rg
        self.leaf = leaf


def broadcast(a, b):
    out = []
    for i in range(max(len(a), len(b))):
        x = a[-1 - i] if i < len(a) else 1
        y = b[-1 - i] if i < len(b) else 1
        if x != y and x != 1 and y != 1:
            return None
        out.append(max(x, y) if x != 1 else y)
    return out[::-1]


def promote(a, b):
    if a == b:
        return a
    order = ["bool", "uint8", "int8", "int32", "int64", "long"]
    fa, fb = a not in order, b not in order
    if fa and not fb:
        return a
    if fb and not fa:
        return b
    if not fa:
        return a if order.index(a) > order.index(b) else b
    canon = {"float": "float32", "half": "f16", "torch.float32": "float32"}
    a, b = canon.get(a, a), canon.get(b, b)
    if a == b:
        return a
    if "float64" in (a, b):
        return "float64"
    return "float32"


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


class ScriptGen:
    def __init__(self, rng, cpu=False, bad_rate=0.1, big=False):
        self.rng = rng
        self.cpu = cpu
        self.bad_rate = bad_rate
        self.big = big and not cpu
        self.vars = {}
        self.others = {}  # name -> kind ('int', 'opt', 'list', 'float')
        self.lines = []
        self.depth = 0
        self.n = 0
        self.in_ckpt = False
        self.in_nograd = False
        self.autocast = None

    # -- helpers --------------------------------------------------------------------------
    def fresh(self, prefix="t"):
        self.n += 1
        return f"{prefix}{self.n}"

    def emit(self, s):
        self.lines.append("    " * self.depth + s)

    def dim(self):
        r = self.rng.random()
        if self.big and r < 0.15:
            return self.rng.choice(MEDIUM)
        return self.rng.choice(SMALL)

    def shape(self, nd=None):
        if nd is None:
            nd = self.rng.choice([1, 2, 2, 2, 3, 3, 4])
        s = [self.dim() for _ in range(nd)]
        while numel(s) > (1 << 20 if self.cpu else 1 << 34):
            s = [max(1, d // 4) for d in s]
        return s

    def pick(self, pred=lambda t: True):
        c = [k for k, t in self.vars.items() if pred(t)]
        return self.rng.choice(c) if c else None

    def pick_known(self, pred=lambda t: True):
        return self.pick(lambda t: t.shape is not None and pred(t))

    def is_float(self, t):
        return t.dtype in FLOAT_DTYPES

    def dtype_kw(self, allow_int=False):
        r = self.rng.random()
        if r < 0.6:
            return "", "float32"
        if r < 0.9 or not allow_int:
            d = self.rng.choice(["bf16", "f16", "float64", "float32"])
            return f", dtype={d}", d
        d = self.rng.choice(INT_DTYPES)
        return f", dtype={d}", d

    def sizes(self, shape):
        if self.rng.random() < 0.15:
            return "[" + ", ".join(map(str, shape)) + "]"
        return ", ".join(map(str, shape))

    def adv_int(self):
        return self.rng.choice(ADV_INTS)

    def maybe_bad_int(self, good):
        if self.rng.random() < self.bad_rate:
            return self.adv_int()
        return str(good)

    def new_tensor(self, shape=None, dtype=None, rg=None, name=None):
        """Emits a factory; returns the name."""
        shape = self.shape() if shape is None else shape
        name = name or self.fresh()
        if dtype is None:
            kw, dtype = self.dtype_kw()
        else:
            kw = f", dtype={dtype}" if dtype != "float32" else ""
        if rg is None:
            rg = dtype in ("float32", "bf16", "f16", "float64") and self.rng.random() < 0.4
        fac = self.rng.choice(["randn", "randn", "rand", "zeros", "ones", "empty"])
        rgs = ", requires_grad=true" if rg else ""
        if shape == [] and self.rng.random() < 0.5:
            self.emit(f"{name} = full([], fill_value={self.rng.choice(['1.5', '0', '-inf', '3'])}{kw}{rgs})")
        else:
            self.emit(f"{name} = {fac}({self.sizes(shape) if shape else '[]'}{kw}{rgs})")
        self.vars[name] = T(list(shape), dtype, rg, True)
        return name

    def operand(self, pred=lambda t: True, shape=None):
        """An existing tensor (or a new one) matching pred."""
        n = self.pick_known(pred)
        if n is None or self.rng.random() < 0.2:
            n = self.new_tensor(shape=shape)
        return n

    def set(self, name, shape, dtype, rg_from=()):
        rg = any(self.vars[x].rg for x in rg_from if x in self.vars) and not self.in_nograd
        self.vars[name] = T(shape, dtype, rg, leaf=not rg)

    # -- valid statements -------------------------------------------------------------------
    def st_factory(self):
        self.new_tensor()

    def st_arange(self):
        n = self.rng.choice(SMALL)
        name = self.fresh()
        form = self.rng.randrange(3)
        if form == 0:
            self.emit(f"{name} = arange({n})")
            self.vars[name] = T([n], "int64")
        elif form == 1:
            self.emit(f"{name} = arange(0, {n}, 1, dtype=float32)")
            self.vars[name] = T([n], "float32")
        else:
            self.emit(f"{name} = arange(0.0, {n}.0, 0.5)")
            self.vars[name] = T([2 * n], "float32")

    def st_unary(self):
        x = self.operand(self.is_float)
        t = self.vars[x]
        op = self.rng.choice(UNARY + ["tril"] * (1 if t.shape and len(t.shape) >= 2 else 0))
        name = self.fresh()
        if self.rng.random() < 0.5:
            self.emit(f"{name} = {op}({x})")
        else:
            self.emit(f"{name} = {x}.{op}()")
        self.set(name, list(t.shape), t.dtype, [x])

    def st_binary(self):
        x = self.operand(self.is_float)
        t = self.vars[x]
        sym = self.rng.choice(list(BINARY))
        r = self.rng.random()
        name = self.fresh()
        if r < 0.3:
            other = self.rng.choice(["2", "0.5", "1e-3", "-1", "inf", "x.numel()"]).replace("x", x)
            expr = f"{x} {sym} {other}" if self.rng.random() < 0.7 else f"{other} {sym} {x}"
            self.emit(f"{name} = {expr}")
            self.set(name, list(t.shape), t.dtype, [x])
            return
        # a broadcastable partner
        k = self.rng.randrange(len(t.shape) + 1)
        sh = list(t.shape[len(t.shape) - k:])
        sh = [1 if self.rng.random() < 0.2 else d for d in sh]
        y = self.pick_known(lambda u: u.shape == sh and self.is_float(u)) or self.new_tensor(sh)
        if self.rng.random() < 0.6:
            self.emit(f"{name} = {x} {sym} {y}")
        else:
            self.emit(f"{name} = {BINARY[sym]}({x}, {y})")
        out = broadcast(t.shape, self.vars[y].shape)
        self.set(name, out, promote(t.dtype, self.vars[y].dtype), [x, y])

    def st_compare(self):
        x = self.operand()
        t = self.vars[x]
        op = self.rng.choice(COMPARE)
        name = self.fresh()
        other = self.rng.choice(["0", "0.5", x])
        self.emit(f"{name} = {x}.{op}({other})" if self.rng.random() < 0.5 else f"{name} = {op}({x}, {other})")
        self.vars[name] = T(list(t.shape), "bool")

    def st_matmul(self):
        x = self.operand(lambda t: self.is_float(t) and len(t.shape) >= 1)
        t = self.vars[x]
        k = t.shape[-1]
        n = self.dim()
        w = self.pick_known(lambda u: u.shape == [k, n] and u.dtype == t.dtype) or \
            self.new_tensor([k, n], dtype=t.dtype)
        name = self.fresh()
        self.emit(f"{name} = {x} @ {w}" if self.rng.random() < 0.7 else f"{name} = matmul({x}, {w})")
        self.set(name, t.shape[:-1] + [n], self.autocast or t.dtype, [x, w])

    def st_linear(self):
        x = self.operand(lambda t: self.is_float(t) and len(t.shape) >= 1)
        t = self.vars[x]
        k = t.shape[-1]
        n = self.dim()
        w = self.new_tensor([n, k], dtype=t.dtype)
        name = self.fresh()
        if self.rng.random() < 0.5:
            b = self.new_tensor([n], dtype=t.dtype)
            self.emit(f"{name} = linear({x}, {w}, bias={b})")
        else:
            self.emit(f"{name} = linear({x}, {w})")
        self.set(name, t.shape[:-1] + [n], self.autocast or t.dtype, [x, w])

    def st_addmm(self):
        m, k, n = self.dim(), self.dim(), self.dim()
        a = self.new_tensor([m, k])
        b = self.new_tensor([k, n])
        c = self.new_tensor([n])
        name = self.fresh()
        self.emit(f"{name} = addmm({c}, {a}, {b})")
        self.set(name, [m, n], self.autocast or "float32", [a, b, c])

    def st_reduce(self):
        x = self.operand()
        t = self.vars[x]
        op = self.rng.choice(["sum", "mean", "argmax", "max", "all", "any", "sum"])
        name = self.fresh()
        nd = len(t.shape)
        if op == "max" or nd == 0 or self.rng.random() < 0.4:
            self.emit(f"{name} = {x}.{op}()")
            out = []
        else:
            d = self.rng.randrange(-nd, nd)
            keep = self.rng.random() < 0.3 and op in ("sum", "mean", "argmax")
            kd = ", keepdim=true" if keep else ""
            if op in ("sum", "mean") and self.rng.random() < 0.2 and nd >= 2:
                self.emit(f"{name} = {x}.{op}(dim=[0, -1]{kd})")
                out = [s for i, s in enumerate(t.shape) if i not in (0, nd - 1)] if not keep else \
                    [1 if i in (0, nd - 1) else s for i, s in enumerate(t.shape)]
            else:
                self.emit(f"{name} = {op}({x}, dim={self.maybe_bad_int(d)}{kd})")
                out = list(t.shape)
                if keep:
                    out[d] = 1
                else:
                    out.pop(d)
        dt = {"argmax": "int64", "all": "bool", "any": "bool"}.get(op, t.dtype)
        if op == "sum" and t.dtype in INT_DTYPES:
            dt = "int64"
        self.set(name, out, dt, [x] if op in ("sum", "mean", "max") else [])

    def st_softmax(self):
        x = self.operand(lambda t: self.is_float(t) and len(t.shape) >= 1)
        t = self.vars[x]
        op = self.rng.choice(["softmax", "log_softmax", "safe_softmax"])
        d = self.rng.randrange(-len(t.shape), len(t.shape))
        name = self.fresh()
        self.emit(f"{name} = {x}.{op}(dim={self.maybe_bad_int(d)})")
        self.set(name, list(t.shape), t.dtype, [x])

    def st_norm(self):
        x = self.operand(lambda t: self.is_float(t) and len(t.shape) >= 1)
        t = self.vars[x]
        e = t.shape[-1]
        w = self.new_tensor([e], dtype=t.dtype, rg=True)
        name = self.fresh()
        if self.rng.random() < 0.5:
            b = self.new_tensor([e], dtype=t.dtype, rg=True)
            self.emit(f"{name} = layer_norm({x}, {w}, {b}, eps={self.rng.choice(['1e-5', '0'] + (['-1', 'inf'] if self.bad_rate else []))})")
        else:
            self.emit(f"{name} = rms_norm({x}, weight={w})")
        self.set(name, list(t.shape), t.dtype, [x, w])

    def st_cross_entropy(self):
        n, c = self.dim(), self.dim()
        logits = self.operand(lambda t: len(t.shape) == 2 and self.is_float(t), shape=[n, c])
        n, c = self.vars[logits].shape
        tgt = self.fresh()
        r = self.rng.random()
        if r < 0.7:
            self.emit(f"{tgt} = zeros({n}, dtype=int64)")
        elif r < 0.85 or not self.bad_rate:
            self.emit(f"{tgt} = full({n}, fill_value={c - 1}, dtype=int64)")
        else:
            self.emit(f"{tgt} = full({n}, fill_value={self.rng.choice([c, -1, c + 100, I64_MAX, -100])}, dtype=int64)")
        self.vars[tgt] = T([n], "int64")
        name = self.fresh("loss")
        self.emit(f"{name} = cross_entropy({logits}, {tgt})")
        self.set(name, [], self.vars[logits].dtype, [logits])

    def st_embedding(self):
        v, d = self.dim(), self.dim()
        w = self.new_tensor([v, d], rg=True)
        idx = self.fresh("idx")
        sh = self.shape(self.rng.choice([1, 2]))
        r = self.rng.random()
        if r < 0.8 or not self.bad_rate:
            self.emit(f"{idx} = zeros({self.sizes(sh)}, dtype=int64)")
        else:
            bad = self.rng.choice([v, -1, v * 10, I64_MAX])
            self.emit(f"{idx} = full({', '.join(map(str, sh))}, fill_value={bad}, dtype=int64)")
        self.vars[idx] = T(sh, "int64")
        name = self.fresh()
        self.emit(f"{name} = embedding({idx}, {w})")
        self.set(name, sh + [d], "float32", [w])

    def st_sdpa(self):
        b, h, l, d = self.rng.choice([1, 2]), self.rng.choice([1, 2, 4]), self.rng.choice(SMALL), \
            self.rng.choice([8, 16, 32, 64])
        dt = self.rng.choice(["float32", "bf16", "f16"])
        gqa = self.rng.random() < 0.3 and h > 1
        hk = 1 if gqa else h
        s = l if self.rng.random() < 0.7 else self.rng.choice(SMALL)
        q = self.new_tensor([b, h, l, d], dtype=dt, rg=True)
        k = self.new_tensor([b, hk, s, d], dtype=dt, rg=True)
        v = self.new_tensor([b, hk, s, d], dtype=dt, rg=True)
        kw = []
        if gqa:
            kw.append("enable_gqa=true")
        if self.rng.random() < 0.3:
            kw.append(f"is_causal={self.rng.choice(['true', 'false'])}")
        if self.rng.random() < 0.2:
            kw.append(f"dropout_p={self.rng.choice(['0.1', '0', '1'] + (['1.5', '-1'] if self.bad_rate else []))}")
        if self.rng.random() < 0.2 and dt == "float32" and not gqa and (self.rng.random() < 0.2 or not any(k.startswith("is_causal") for k in kw)):
            if not any(k.startswith("is_causal") for k in kw):
                kw.append("is_causal=false")
            m = self.new_tensor(self.rng.choice([[l, s], [1, 1, l, s], [b, h, l, s], [s]]), dtype="float32")
            kw.append(f"attn_mask={m}")
        name = self.fresh()
        self.emit(f"{name} = scaled_dot_product_attention({q}, {k}, {v}{''.join(', ' + x for x in kw)})")
        self.set(name, [b, h, l, d], dt, [q])

    def st_conv(self):
        n, c, hw = self.rng.choice([1, 2]), self.rng.choice([1, 3, 4, 8]), self.rng.choice([4, 7, 8, 16])
        g = self.rng.choice([1, 1, 1, c])
        o = self.rng.choice([1, 2, 4, 8]) * g
        k = self.rng.choice([1, 3, 5])
        x = self.new_tensor([n, c, hw, hw])
        w = self.new_tensor([o, c // g, k, k], rg=True)
        stride, pad, dil = self.rng.choice([1, 2]), self.rng.choice([0, 1, 2]), self.rng.choice([1, 1, 2])
        while hw + 2 * pad < dil * (k - 1) + 1:
            k, dil = 1, 1
        name = self.fresh()
        b = ""
        if self.rng.random() < 0.3:
            b = ", bias=" + self.new_tensor([o])
        self.emit(f"{name} = conv2d({x}, {w}{b}, stride={self.maybe_bad_int(stride)}, padding={pad}, "
                  f"dilation={dil}, groups={g})")
        ho = (hw + 2 * pad - dil * (k - 1) - 1) // stride + 1
        self.set(name, [n, o, ho, ho] if ho > 0 else None, self.autocast or "float32", [w])
        if ho > 0 and self.rng.random() < 0.5:
            self.vision_followup(name, n, o, ho)

    def vision_followup(self, x, n, c, hw):
        r = self.rng.random()
        name = self.fresh()
        if r < 0.4:
            rm, rv = self.new_tensor([c]), self.new_tensor([c])
            w, b = self.new_tensor([c], rg=True), self.new_tensor([c], rg=True)
            tr = self.rng.choice(["true", "false"]) if (self.in_nograd or self.bad_rate) else "true"
            self.emit(f"{name} = batch_norm({x}, {rm}, {rv}, {w}, {b}, training={tr}, "
                      f"momentum={self.rng.choice(['0.1', '0', '1'] + (['-1', '-inf'] if self.bad_rate else []))})")
            self.set(name, [n, c, hw, hw], "float32", [x, w])
        elif r < 0.7:
            k = self.rng.choice([1, 2, 3])
            self.emit(f"{name} = max_pool2d({x}, {k}, stride={self.rng.choice([1, 2, 'none'])}, "
                      f"padding={self.rng.choice([0, 1])})")
            self.set(name, None, "float32", [x])
        else:
            o = self.rng.choice([1, 2, 7, hw, hw + 3])
            self.emit(f"{name} = adaptive_avg_pool2d({x}, {o})")
            self.set(name, [n, c, o, o], "float32", [x])

    def st_view(self):
        x = self.operand(lambda t: len(t.shape) >= 1)
        t = self.vars[x]
        name = self.fresh()
        nd = len(t.shape)
        r = self.rng.randrange(10)
        sh = list(t.shape)
        if r == 0:
            self.emit(f"{name} = {x}.view(-1)")
            out = [numel(sh)]
        elif r == 1:
            self.emit(f"{name} = {x}.reshape({numel(sh)}, -1)")
            out = [numel(sh), 1]
        elif r == 2 and nd == 2:
            self.emit(f"{name} = {x}.t()")
            out = sh[::-1]
        elif r == 3 and nd >= 2:
            a, b = self.rng.sample(range(nd), 2)
            self.emit(f"{name} = {x}.transpose({self.maybe_bad_int(a)}, {b})")
            out = list(sh)
            out[a], out[b] = out[b], out[a]
        elif r == 4:
            p = list(range(nd))
            self.rng.shuffle(p)
            self.emit(f"{name} = {x}.permute({', '.join(map(str, p))})")
            out = [sh[i] for i in p]
        elif r == 5:
            d = self.rng.randrange(-nd - 1, nd + 1)
            self.emit(f"{name} = {x}.unsqueeze({self.maybe_bad_int(d)})")
            out = list(sh)
            out.insert(d if d >= 0 else nd + 1 + d, 1)
        elif r == 6 and nd >= 2:
            self.emit(f"{name} = {x}.flatten(1)")
            out = [sh[0], numel(sh[1:])]
        elif r == 7:
            self.emit(f"{name} = {x}.squeeze()")
            out = [d for d in sh if d != 1]
        elif r == 8:
            out = [self.rng.choice([2, 3]) if d == 1 else d for d in sh]
            self.emit(f"{name} = {x}.expand({', '.join(str(d) if d != o else '-1' for d, o in zip(out, sh))})")
        else:
            self.emit(f"{name} = {x}.contiguous()" if self.rng.random() < 0.5 else f"{name} = {x}.clone()")
            out = sh
        v = self.vars[x]
        self.vars[name] = T(out, v.dtype, v.rg, leaf=False if v.rg else True)

    def st_slice(self):
        x = self.operand(lambda t: len(t.shape) >= 1)
        t = self.vars[x]
        parts = []
        out = []
        for d in t.shape:
            r = self.rng.random()
            if r < 0.3 or d == 0:
                parts.append(":")
                out.append(d)
            elif r < 0.5:
                i = self.rng.randrange(-d, d)
                parts.append(str(i))
            elif r < 0.8:
                a = self.rng.randrange(0, d)
                b = self.rng.randrange(a, d + 1)
                s = self.rng.choice([1, 1, 2, 3])
                parts.append(f"{a}:{b}:{s}" if s != 1 else f"{a}:{b}")
                out.append(len(range(a, b, s)))
            else:
                text, sl = self.rng.choice([(":", slice(None)), ("::2", slice(None, None, 2)),
                                            ("-1:", slice(-1, None)), (":-1", slice(None, -1)),
                                            ("100:", slice(100, None)), (":100", slice(None, 100)),
                                            ("-100:", slice(-100, None))])
                parts.append(text)
                out.append(len(range(d)[sl]))
            if len(parts) == 1 and self.rng.random() < 0.1:
                parts.insert(0, "none")
        if self.rng.random() < 0.15:
            parts = parts[:1] + ["..."]
            out = None
        name = self.fresh()
        self.emit(f"{name} = {x}[{', '.join(parts)}]")
        v = self.vars[x]
        self.vars[name] = T(None if out is None or None in out else out, v.dtype, v.rg, leaf=not v.rg)

    def st_cat(self):
        x = self.operand(lambda t: len(t.shape) >= 1)
        t = self.vars[x]
        same = [k for k, u in self.vars.items() if u.shape == t.shape and u.dtype == t.dtype][:3]
        if len(same) < 2:
            same = [x, x]
        op = self.rng.choice(["cat", "stack"])
        d = self.rng.randrange(len(t.shape))
        name = self.fresh()
        self.emit(f"{name} = {op}([{', '.join(same)}], dim={self.maybe_bad_int(d)})")
        out = list(t.shape)
        if op == "cat":
            out[d] *= len(same)
        else:
            out.insert(d, len(same))
        self.set(name, out, t.dtype, same)

    def st_split(self):
        x = self.operand(lambda t: len(t.shape) >= 1 and t.shape[0] >= 2)
        t = self.vars[x]
        if t.shape[0] < 2:
            return self.st_unary()
        a, b = self.fresh(), self.fresh()
        if self.rng.random() < 0.5:
            self.emit(f"{a}, {b} = {x}.chunk(2, dim=0)")
        else:
            h = (t.shape[0] + 1) // 2
            self.emit(f"{a}, {b} = {x}.split({h})")
        h = (t.shape[0] + 1) // 2
        for n_, s in ((a, h), (b, t.shape[0] - h)):
            self.vars[n_] = T([s] + t.shape[1:], t.dtype, t.rg, leaf=not t.rg)

    def st_misc(self):
        x = self.operand()
        t = self.vars[x]
        name = self.fresh()
        r = self.rng.randrange(12)
        sh = list(t.shape)
        if r == 0 and sh:
            d = self.rng.randrange(len(sh))
            rep = self.rng.choice([1, 2, 3])
            self.emit(f"{name} = {x}.repeat_interleave({rep}, dim={d})")
            sh[d] *= rep
            self.set(name, sh, t.dtype, [x])
        elif r == 1 and sh:
            a, b = self.rng.choice([0, 1, 2]), self.rng.choice([0, 1, 3])
            self.emit(f"{name} = pad({x}, {a}, {b}, value={self.rng.choice(['0', '1.5', '-inf'])})")
            sh[-1] += a + b
            self.set(name, sh, t.dtype, [x])
        elif r == 2 and self.is_float(t):
            self.emit(f"{name} = dropout({x}, p={self.rng.choice(['0.1', '0.5', '0', '1'])}, "
                      f"training={self.rng.choice(['true', 'false'])})")
            self.set(name, sh, t.dtype, [x])
        elif r == 3:
            m = self.fresh("mask")
            self.emit(f"{m} = {x}.gt(0)")
            self.vars[m] = T(sh, "bool")
            self.emit(f"{name} = {x}.masked_fill({m}, {self.rng.choice(['-inf', '0', '1e30'])})")
            self.set(name, sh, t.dtype, [x])
        elif r == 4:
            y = self.pick_known(lambda u: u.shape == sh and u.dtype == t.dtype) or x
            self.emit(f"{name} = where({x}.gt(0), {x}, {y})")
            self.set(name, sh, t.dtype, [x, y])
        elif r == 5 and sh and (t.dtype in INT_DTYPES or not t.rg or self.in_nograd or self.rng.random() < 0.1):
            d = self.rng.randrange(len(sh))
            self.emit(f"{name} = {x}.cumsum({self.maybe_bad_int(d)})")
            self.set(name, sh, t.dtype if self.is_float(t) else "int64", [x])
        elif r == 6:
            self.emit(f"{name} = isin({x}, arange(3))")
            self.vars[name] = T(sh, "bool")
        elif r == 7 and self.is_float(t):
            e = self.rng.choice(["2", "0.5", "3", "-1", "0", "nan"])
            self.emit(f"{name} = {x} ** {e}" if self.rng.random() < 0.5 else f"{name} = {x}.pow({e})")
            self.set(name, sh, t.dtype, [x])
        elif r == 8:
            c = self.rng.choice(["float()", "half()", "bfloat16()", "double()", "to(dtype=bf16)",
                                 "to(dtype=int64)", "to(dtype=bool)"])
            self.emit(f"{name} = {x}.{c}")
            dt = {"float()": "float32", "half()": "f16", "bfloat16()": "bf16", "double()": "float64",
                  "to(dtype=bf16)": "bf16", "to(dtype=int64)": "int64", "to(dtype=bool)": "bool"}[c]
            self.set(name, sh, dt, [x] if dt in FLOAT_DTYPES else [])
        elif r == 9:
            self.emit(f"{name} = {x}.detach()")
            self.vars[name] = T(sh, t.dtype)
        elif r == 10:
            self.emit(f"{name} = {x}.numel() * 2")
            self.others[name] = "int"
        else:
            if self.rng.random() < 0.5 and t.dtype in INT_DTYPES + ["bool"]:
                self.emit(f"{name} = {x}.bitwise_not()")
            else:
                self.emit(f"{name} = {x}.logical_not()")
            self.vars[name] = T(sh, t.dtype)

    def st_inplace(self):
        x = self.operand(lambda t: self.is_float(t) and not (t.rg and t.leaf))
        t = self.vars[x]
        if t.rg and not self.in_nograd:
            op = self.rng.choice(["add_", "sub_", "mul_", "div_", "relu_", "exp_", "neg_"])
        else:
            op = self.rng.choice(INPLACE)
        if t.rg and t.leaf and not self.in_nograd:
            return self.st_unary()
        if op in ("add_", "sub_", "mul_", "div_"):
            arg = self.rng.choice(["2", "0.5"] + ([x] if op in ("add_", "sub_") and not t.rg else []))
            self.emit(f"{x}.{op}({arg})")
        elif op == "fill_":
            self.emit(f"{x}.fill_({self.rng.choice(['0', '1.5', '-inf', 'nan' if False else '2'])})")
        elif op == "copy_":
            self.emit(f"{x}.copy_({x}.clone())" if self.rng.random() < 0.5 else f"{x}[...] = 1")
        else:
            self.emit(f"{x}.{op}()")

    def st_setitem(self):
        x = self.operand(lambda t: len(t.shape) >= 1 and not t.rg)
        t = self.vars[x]
        if not t.shape:
            return
        i = self.rng.randrange(t.shape[0])
        rhs = self.rng.choice(["0", "1.5"]) if self.rng.random() < 0.5 else \
            f"randn({', '.join(map(str, t.shape[1:])) or '[]'})"
        self.emit(f"{x}[{i}] = {rhs}")

    def forget_graph(self):
        """After a backward without retain_graph: the graph's tensors are not used again."""
        for k in [k for k, t in self.vars.items() if t.rg and not t.leaf]:
            del self.vars[k]

    def st_backward(self):
        if self.in_ckpt and self.bad_rate == 0:
            return self.st_unary()
        x = self.pick_known(lambda t: t.rg and self.is_float(t))
        if x is None:
            w = self.new_tensor(self.shape(), dtype="float32", rg=True)
            x = self.fresh()
            self.emit(f"{x} = ({w} * 2).sin()")
            self.set(x, list(self.vars[w].shape), "float32", [w])
        loss = self.fresh("loss")
        red = self.rng.choice(["sum", "mean"])
        self.emit(f"{loss} = {x}.{red}()")
        self.set(loss, [], self.vars[x].dtype, [x])
        rg = self.rng.random() < 0.3
        self.emit(f"{loss}.backward({'retain_graph=true' if rg else ''})")
        if self.rng.random() < 0.3:
            self.emit(f"keep({loss}.item())" if self.rng.random() < 0.5 else f"keep({loss})")
        if not rg or self.rng.random() < 0.5:
            self.forget_graph()

    def st_grad(self):
        w = self.pick(lambda t: t.rg and t.leaf)
        if w is None:
            return self.st_factory()
        g = self.fresh("g")
        self.emit(f"{g} = {w}.grad")
        self.others[g] = "maybe-none"

    def st_optim(self):
        leaves = [k for k, t in self.vars.items() if t.rg and t.leaf][:6]
        if not leaves:
            leaves = [self.new_tensor(self.shape(), rg=True)]
        o = self.rng.choice(["sgd", "adam", "adamw"])
        kw = []
        if self.rng.random() < 0.4:
            kw.append(f"lr={self.rng.choice(['0.1', '0', '1e-3'] + (['-1', '1e308', 'inf'] if self.bad_rate else []))}")
        if o == "sgd" and self.rng.random() < 0.5:
            kw.append(f"momentum={self.rng.choice(['0.9', '0'] + (['-1', '2'] if self.bad_rate else []))}")
        if o != "sgd" and self.rng.random() < 0.3:
            kw.append(f"betas={self.rng.choice(['[0.9, 0.999]', '[0, 0]'] + (['[1, 1]', '[2, -1]'] if self.bad_rate else []))}")
        if self.rng.random() < 0.3:
            kw.append(f"weight_decay={self.rng.choice(['0', '0.1'] + (['-1'] if self.bad_rate else []))}")
        if self.rng.random() < 0.3:
            kw.append(f"foreach={self.rng.choice(['true', 'false'])}")
        name = self.fresh("opt")
        self.emit(f"{name} = {o}([{', '.join(leaves)}]{''.join(', ' + k for k in kw)})")
        self.others[name] = "opt"
        if self.rng.random() < 0.7:
            self.st_backward()
            self.emit(f"{name}.step()")
            self.emit(f"{name}.zero_grad({self.rng.choice(['', 'set_to_none=false', 'set_to_none=true'])})")

    def st_util(self):
        r = self.rng.randrange(9)
        if r == 0:
            x = self.pick()
            if x:
                self.emit(f"keep({x})")
        elif r == 1:
            self.emit(f'mark("{self.rng.choice(["a", "after forward", "ü", ""])}")')
        elif r == 2:
            self.emit("empty_cache()")
        elif r == 3:
            self.emit("reset_peak_memory_stats()")
        elif r == 4:
            self.emit("synchronize()")
        elif r == 5:
            x = self.pick_known(lambda t: numel(t.shape) == 1)
            if x:
                v = self.fresh("v")
                self.emit(f"{v} = {x}.item()")
                self.others[v] = "float"
        elif r == 6:
            x = self.pick()
            if x and not self.in_ckpt:
                self.emit(f"del {x}")
                del self.vars[x]
        elif r == 7:
            x = self.pick_known(lambda t: len(t.shape) >= 1)
            if x:
                n = self.fresh("n")
                self.emit(f"{n} = {x}.shape[0] + {x}.shape[-1]")
                self.others[n] = "int"
        else:
            x = self.pick_known(self.is_float)
            if x:
                t = self.vars[x]
                if t.leaf or self.bad_rate:
                    on = self.rng.choice(['', 'true', 'false'])
                    self.emit(f"{x}.requires_grad_({on})")
                    if t.leaf:
                        t.rg = on != "false"

    def st_block(self, budget):
        kind = self.rng.choice(["no_grad", "autocast", "checkpoint", "scope", "phase", "for"])
        saved = (self.in_ckpt, self.in_nograd, self.autocast)
        if kind == "no_grad":
            self.emit("no_grad {")
            self.in_nograd = True
        elif kind == "autocast":
            a = self.rng.choice(['bf16', 'dtype=bf16', 'f16', 'dtype=float16'])
            self.emit(f"autocast({a}) {{")
            self.autocast = "bf16" if "bf16" in a else "f16"
        elif kind == "checkpoint":
            self.emit("checkpoint {")
            self.in_ckpt = True
        elif kind == "scope":
            self.emit(f'scope "{self.rng.choice(["encoder.layer0", "a", "x.y.z", "名", "layer 3"])}" {{')
        elif kind == "phase":
            self.emit(f'phase "{self.rng.choice(["forward", "backward", "optimizer", "other"])}" {{')
        else:
            self.emit(f"for i in range({self.rng.choice([1, 2, 3, 10])}) {{")
            self.forget_graph()
        self.depth += 1
        self.statements(max(1, budget))
        self.depth -= 1
        self.emit("}")
        self.in_ckpt, self.in_nograd, self.autocast = saved

    VALID = [
        ("st_factory", 6), ("st_arange", 2), ("st_unary", 8), ("st_binary", 8), ("st_compare", 2),
        ("st_matmul", 6), ("st_linear", 3), ("st_addmm", 1), ("st_reduce", 5), ("st_softmax", 3),
        ("st_norm", 3), ("st_cross_entropy", 2), ("st_embedding", 2), ("st_sdpa", 3), ("st_conv", 3),
        ("st_view", 6), ("st_slice", 4), ("st_cat", 2), ("st_split", 2), ("st_misc", 6),
        ("st_inplace", 3), ("st_setitem", 1), ("st_backward", 4), ("st_grad", 1), ("st_optim", 2),
        ("st_util", 4),
    ]

    def statements(self, n):
        names = [x for x, _ in self.VALID]
        weights = [w for _, w in self.VALID]
        for _ in range(n):
            r = self.rng.random()
            if r < self.bad_rate:
                for line in adversarial_statement(self):
                    self.emit(line)
            elif r < self.bad_rate + 0.06 and self.depth < 3:
                self.st_block(self.rng.randrange(1, 5))
            else:
                mark = len(self.lines)
                try:
                    getattr(self, self.rng.choices(names, weights)[0])()
                except (ValueError, IndexError, ZeroDivisionError, TypeError, KeyError):
                    # the generator's own belief about a shape did not allow this op
                    del self.lines[mark:]
                    self.st_factory()


RG_YES = 'requires_grad="yes"'
QAB = '"a", "b"'
LABX = 'label="x"'
DEVCUDA = 'device="cuda"'
QA_PLUS = '"a" + 1'
QA_TIMES = '"a" * 1000000'
YES = '"yes"'
LR_A = ', lr="a"'
QA = '"a"'
QQ = '""'


def adversarial_statement(g: ScriptGen):
    """One or a few lines that use the engine wrongly (or at its edges)."""
    rng = g.rng
    x = g.pick_known() or g.new_tensor()
    t = g.vars[x]
    nd = len(t.shape)
    ai = g.adv_int
    n = g.fresh("bad")
    choices = [
        lambda: [f"{n} = {rng.choice(['randn', 'zeros', 'ones', 'empty', 'rand'])}("
                 f"{', '.join(ai() for _ in range(rng.randrange(1, 4)))})"],
        lambda: [f"{n} = full({ai()}, {rng.choice(['fill_value=', ''])}{rng.choice(['1', 'nan', 'inf', '1e308', x, ai()])})"],
        lambda: [f"{n} = full({rng.choice(['[2, 3]', '[]', '2, 3', ''])}, {rng.choice(['fill_value=', ''])}{rng.choice(['1', 'nan', 'inf', '1e308', x, ai(), '[1]'])}, dtype={rng.choice(['int64', 'bool', 'int8', 'uint8', 'bf16'])})"],
        lambda: [f"{rng.choice(['λ', '变量', 'x' + chr(0x301), 'ñame', 'Ω_1', 'ü', '名前', 'a' + chr(0x200d) + 'b', 'ﬁ', 'K', 'ǅ'])} = {x} * 2"],
        lambda: [f"{n} = arange({ai()})", ] if rng.random() < 0.5 else
        [f"{n} = arange({ai()}, {ai()}, {rng.choice(['0', '-1', '1e-300', '0.0', ai()])})"],
        lambda: [f"{n} = {x} {rng.choice(['+', '*', '-', '/'])} randn({', '.join(str(d + 1) for d in t.shape) or '2'})"],
        lambda: [f"{n} = {x} @ randn({rng.choice(['3, 5', '7', '1', '0, 0', '[]', '2, 3, 4, 5'])})"],
        lambda: [f"{n} = randn(0) @ randn(0)"],
        lambda: [f"{n} = randn([]) @ randn([])"],
        lambda: [f"{n} = {x}.{rng.choice(['sum', 'mean', 'softmax', 'log_softmax', 'cumsum', 'argmax', 'all', 'any', 'squeeze', 'unsqueeze'])}"
                 f"({rng.choice(['dim=', ''])}{rng.choice([str(nd), str(-nd - 1), str(nd + 1), ai(), '[0, 0]', '[]', '[' + str(nd) + ']'])})"],
        lambda: [f"{n} = {x}.transpose({ai()}, {rng.choice(['0', ai()])})"],
        lambda: [f"{n} = {x}.permute({', '.join(rng.choice(['0', '0', '1', '-1', ai()]) for _ in range(max(1, nd + rng.choice([-1, 0, 1]))))})"],
        lambda: [f"{n} = {x}.view({', '.join(rng.choice(['-1', '-1', '0', '3', ai()]) for _ in range(rng.randrange(1, 4)))})"],
        lambda: [f"{n} = {x}.reshape({rng.choice(['-1, -1', '0', ai(), str(numel(t.shape) + 1), '-2'])})"],
        lambda: [f"{n} = {x}.expand({', '.join(ai() for _ in range(max(1, nd)))})"],
        lambda: [f"{n} = {x}.flatten({ai()}, {ai()})"],
        lambda: [f"{n} = {x}.t()"],
        lambda: [f"{n} = {x}[{rng.choice([str(I64_MAX) + ':', '-9223372036854775807:', '::0', '::-1', '::' + str(I64_MAX), '1:0', '5:2:-1', ':' + str(2**62), '-' + str(2**62) + ':' + str(2**62) + ':' + str(2**62)])}]"],
        lambda: [f"{n} = {x}[{', '.join(['0'] * (nd + rng.choice([1, 2, 5])))}]"],
        lambda: [f"{n} = {x}[{rng.choice(['..., ...', '1.5', x, 'none, ' * 70 + '0', '[0, 1]', 'true', QA, str(I64_MAX), str(-(2**62)), '...,' + 'none,' * 64])}]"],
        lambda: [f"{n} = randn(2, 3, dtype={rng.choice(BAD_DTYPES)})"],
        lambda: [f"{n} = randn(2, {rng.choice(['foo=1', 'requires_grad=1', RG_YES, 'dtype=bf16, dtype=f32', 'requires_grad=true, requires_grad=false', 'size=3', 'dtype=int64, requires_grad=true'])})"],
        lambda: [f"{n} = randn(dtype=bf16, 2)"],
        lambda: [f"{n} = {rng.choice(['softmax', 'where', 'linear', 'conv2d', 'cross_entropy', 'embedding', 'scaled_dot_product_attention', 'layer_norm', 'batch_norm', 'max_pool2d', 'adaptive_avg_pool2d', 'cat', 'stack', 'pad', 'isin', 'addmm', 'matmul', 'pow', 'dropout', 'sgd', 'adam', 'keep', 'mark', 'empty_cache'])}"
                 f"({', '.join([x] * rng.randrange(0, 9))})"],
        lambda: [f"{n} = conv2d({x}, randn({rng.choice(['4, 3, 3, 3', '1, 1, 1', '2, 2', '1, 1, 100, 100', '0, 1, 1, 1'])}), stride={rng.choice(['1', '0', '-1', ai()])}, padding={rng.choice(['0', '-1', ai()])}, dilation={rng.choice(['1', '0', ai()])}, groups={rng.choice(['1', '0', '3', ai()])})"],
        lambda: [f"{n} = conv2d(randn(1, 3, 8, 8), randn(4, 3, {rng.choice(['3, 3', '9, 9', '3, 5', '0, 0'])}), stride={rng.choice(['1', '0', '-1', ai()])}, padding={rng.choice(['0', '-5', ai()])}, dilation={rng.choice(['1', '0', ai()])}, groups={rng.choice(['1', '0', '-1', '2', ai()])})"],
        lambda: [f"{n} = batch_norm({x}, randn(3), randn(3), randn(3), randn(3), training={rng.choice(['true', 'false', '1'])})"],
        lambda: [f"{n} = max_pool2d({rng.choice([x, 'randn(1, 1, 4, 4)', 'randn(4, 4)'])}, {rng.choice(['0', '-1', '5', '100', ai()])}, stride={rng.choice(['0', '-1', 'none', ai()])}, padding={rng.choice(['0', '3', '-1', ai()])})"],
        lambda: [f"{n} = adaptive_avg_pool2d({rng.choice([x, 'randn(1, 1, 4, 4)', 'randn(4)'])}, {rng.choice(['0', '-1', ai(), '2, 3, 4', '[]'])})"],
        lambda: [f"{n} = scaled_dot_product_attention({rng.choice([x, 'randn(2, 8)', 'randn(1, 2, 4, 8)', 'randn(0, 0, 0, 0)'])}, "
                 f"{rng.choice(['randn(1, 2, 4, 8)', 'randn(1, 3, 4, 8)', 'randn(1, 2, 5, 7)', 'randn(1, 0, 4, 8)'])}, randn(1, 2, 4, 8), "
                 f"enable_gqa={rng.choice(['true', 'false'])}, attn_mask={rng.choice(['none', 'randn(3)', 'randn(4, 4).gt(0)', x])}, dropout_p={rng.choice(['0', '1', '-1', 'nan'])})"],
        lambda: [f"{n} = cross_entropy({rng.choice([x, 'randn(4, 5)', 'randn(4)', 'randn(2, 3, 4)', 'randn(0, 5)', 'randn(4, 0)'])}, {rng.choice(['zeros(4, dtype=int64)', 'randn(4)', 'zeros(3, dtype=int64)', 'full(4, fill_value=99, dtype=int64)', 'full(4, fill_value=-1, dtype=int64)', 'zeros(4, 5)', 'zeros(4, dtype=bool)', x])})"],
        lambda: [f"{n} = embedding({rng.choice(['randn(3)', 'full(3, fill_value=99, dtype=int64)', 'full(3, fill_value=-1, dtype=int64)', 'zeros(3, dtype=int32)', 'zeros(3, dtype=bool)', x, 'zeros([], dtype=int64)', 'full(3, fill_value=' + str(I64_MAX) + ', dtype=int64)'])}, {rng.choice(['randn(10, 4)', 'randn(10)', 'randn(0, 4)', 'randn(10, 4, 2)', x])})"],
        lambda: [f"{n} = layer_norm({x}, weight=randn({rng.choice(['1', '999', '0', str(t.shape[-1] if nd else 1) + ', 2'])}))"],
        lambda: [f"{n} = rms_norm({rng.choice([x, 'randn([])', 'randn(0)'])}, weight=randn({rng.choice(['1', '7', '0'])}), eps={rng.choice(['0', '-1', 'nan', 'inf'])})"],
        lambda: [f"{n} = cat([{rng.choice(['', x, x + ', randn(1)', x + ', 1', x + ', [' + x + ']', x + ', ' + x + '.to(dtype=int64)', 'randn(0), randn(0)', 'randn(2,3), randn(3,2)'])}], dim={rng.choice(['0', '1', '-1', ai()])})"],
        lambda: [f"{n} = stack([{rng.choice(['', x, x + ', randn(1)', 'randn(2,3), randn(3,2)', 'randn([]), randn([])'])}], dim={rng.choice(['0', '1', '-1', ai()])})"],
        lambda: [f"{n} = {x}.split({rng.choice(['0', '-1', ai(), '[1, 2]'])}, dim={rng.choice(['0', ai()])})"],
        lambda: [f"{n} = {x}.chunk({rng.choice(['0', '-1', ai()])}, dim={rng.choice(['0', ai()])})"],
        lambda: [f"{n} = {x}.repeat_interleave({rng.choice(['0', '-1', ai(), x])}, dim={rng.choice(['none', '0', ai()])})"],
        lambda: [f"{n} = pad({x}, {', '.join(rng.choice(['1', '-1', '-100', ai()]) for _ in range(rng.choice([1, 2, 3, 4, 8, 20])))})"],
        lambda: [f"{n} = dropout({x}, p={rng.choice(['-0.5', '1.5', 'nan', ai()])})"],
        lambda: [f"{n} = {x}.masked_fill({rng.choice([x, 'randn(3).gt(0)', 'zeros(1, dtype=bool)', '1'])}, {rng.choice(['0', 'nan', x])})"],
        lambda: [f"{n} = where({rng.choice([x, 'randn(7).gt(0)', '1'])}, {x}, {rng.choice(['randn(9)', '0', x])})"],
        lambda: [f"{n} = isin({x}, {rng.choice(['randn(' + str(2**31) + ')', 'randn(100000)', x, '3', 'randn(0)'])})"],
        lambda: [f"{n} = {x} ** {rng.choice([x, ai(), 'randn(3)'])}"],
        lambda: [f"{n} = {x}.to(dtype={rng.choice(BAD_DTYPES)})"],
        lambda: [f"{n} = {x}.bitwise_and({rng.choice([x, '1', 'zeros(2, dtype=bool)'])})"],
        lambda: [f"{n} = bitwise_or({x}.to(dtype=int64), {rng.choice([x, '1', 'zeros(' + str(t.shape[-1] if nd else 1) + ', dtype=int8)', 'zeros(2, dtype=bool)'])})"],
        # in place on a leaf that requires grad, or on views
        lambda: [f"{n} = randn(3, 3, requires_grad=true)",
                 f"{n}.{rng.choice(['add_(1)', 'mul_(2)', 'relu_()', 'sin_()', 'zero_()', 'fill_(1)', 'exp_()', 'neg_()', 'copy_(randn(3, 3))'])}"],
        lambda: [f"{n} = randn(3, 3, requires_grad=true)", f"{n}[0] = {rng.choice(['1', 'randn(3)', n + '[1]', 'randn(5)'])}"],
        lambda: [f"{n} = randn(4, 4, requires_grad=true)", f"{n}_v = {n}.t()", f"{n}_v.add_(1)"],
        lambda: [f"{n} = randn(4, 4, requires_grad=true)", f"{n}_y = {n}.exp()", f"{n}_y.{rng.choice(['add_(1)', 'mul_(' + n + ')', 'div_(' + n + ')', 'relu_()', 'sin_()', 'zero_()', 'copy_(' + n + ')'])}",
                 f"{n}_y.sum().backward()"],
        lambda: [f"{n} = randn(3, 3).{rng.choice(['add_', 'copy_', 'mul_'])}({rng.choice(['randn(4, 4)', 'randn(3)', 'randn(3, 3, 3)', QA, 'none'])})"],
        lambda: [f"{x}[{rng.choice(['0', str(2**40), '-' + str(2**40), '::0', '..., ...', ':, :, :, :, :'])}] = {rng.choice(['1', 'randn(1000)', x])}"],
        # backward misuse
        lambda: [f"{n} = (randn(3, requires_grad=true) * 2).sum()", f"{n}.backward()", f"{n}.backward()"],
        lambda: [f"{n} = randn(3, requires_grad=true)", f"{n}.{rng.choice(['backward()', 'sum().backward()', 'backward(retain_graph=true)'])}"],
        lambda: [f"{n} = randn(3).sum()", f"{n}.backward()"],
        lambda: [f"{n} = zeros(3, dtype=int64).sum()", f"{n}.backward()"],
        lambda: [f"{n} = (randn(3, 4, requires_grad=true) * 2)", f"{n}.backward()"],
        lambda: [f"{n} = (randn(3, requires_grad=true) * 2).sum()", "no_grad {", f"    {n}.backward()", "}"],
        lambda: [f"{n}_w = randn(3, requires_grad=true)", "checkpoint {", f"    {n} = ({n}_w * 2).sum()", f"    {n}.backward()", "}"],
        lambda: [f"{n}_w = randn(3, requires_grad=true)", "checkpoint {", f"    {n} = ({n}_w * 2).sin()", "}",
                 f"del {n}_w", f"{n}.sum().backward()", f"{n}.sum().backward()"],
        lambda: [f"{n}_w = randn(3, requires_grad=true)", "checkpoint {", "    checkpoint {", f"        {n} = ({n}_w * 2).sin()", "    }", "}",
                 f"{n}.sum().backward(retain_graph=true)", f"{n}.sum().backward()"],
        lambda: [f"{n}_w = randn(3, requires_grad=true)", f"{n} = ({n}_w.exp() * 2).sum()", f"{n}_w.requires_grad_(false)", f"{n}.backward()"],
        lambda: [f"{n}_w = randn(3, requires_grad=true)", f"{n}_y = {n}_w.exp()", f"{n}_y.requires_grad_(false)"],
        lambda: [f"{n} = randn(3, dtype=int64, requires_grad=true)"],
        lambda: [f"{n} = {x}.grad.sum()"],
        lambda: [f"{n} = {x}.backward(retain_graph={rng.choice(['1', 'none', YES, 'x'])})"],
        # optimizers over odd parameter lists
        lambda: [f"{n} = {rng.choice(['sgd', 'adam', 'adamw'])}({rng.choice(['[]', x, '[' + x + ', ' + x + ']', '[1, 2]', '[[' + x + ']]', '[' + x + '.t()]', '[randn(3)]', '[randn(3, requires_grad=true).exp()]', '[randn(3, dtype=int64)]', 'none', '1', ''])}{rng.choice(['', ', lr=-1', ', betas=[0.9]', ', betas=[0.9, 0.99, 0.9]', ', betas=0.9', ', momentum=nan', ', foo=1', ', eps=0', LR_A])})",
                 f"{n}.step()", f"{n}.zero_grad()"],
        lambda: [f"{n}_w = randn(3, requires_grad=true)", f"{n} = adam([{n}_w])", f"del {n}_w", f"{n}.step()", f"{n}.step()"],
        lambda: [f"{n}_w = randn(3, requires_grad=true)", f"{n} = adamw([{n}_w, {n}_w])", f"({n}_w * 2).sum().backward()", f"{n}.step()", f"{n}.step()"],
        lambda: [f"{n}_w = randn(3, dtype=bf16, requires_grad=true)", f"{n}_v = randn(3, dtype=f16, requires_grad=true)", f"{n} = adamw([{n}_w, {n}_v], foreach={rng.choice(['true', 'false'])})",
                 f"({n}_w.float().sum() + {n}_v.float().sum()).backward()", f"{n}.step()"],
        lambda: [f"{n}_w = randn(3, requires_grad=true)", f"{n} = sgd([{n}_w], momentum=0.9)", f"({n}_w * 2).sum().backward()", f"{n}.step()", f"{n}_w.grad.zero_()", f"{n}.zero_grad(set_to_none=false)", f"{n}.step()"],
        lambda: [f"{n} = {x}.step()"],
        lambda: [f"{n} = {rng.choice(['mark', 'keep', 'empty_cache', 'synchronize'])}({rng.choice(['1', x, QAB, '', x + '.shape', 'none'])}).relu()"],
        # deep nesting and long lines
        lambda: [f"{n} = " + "neg(" * rng.choice([50, 500, 5000, 50000]) + x],  # never closed
        lambda: [nest_call(n, x, rng.choice([100, 1000, 10000, 100000]), "neg(", ")")],
        lambda: [nest_call(n, x, rng.choice([100, 1000, 10000, 100000]), "(", ")")],
        lambda: [nest_call(n, "1", rng.choice([100, 1000, 10000, 100000]), "-", "")],
        lambda: [nest_call(n, "1", rng.choice([100, 1000, 10000, 100000]), "[", "]")],
        lambda: [f"{n} = " + " + ".join([x] * rng.choice([100, 1000, 10000, 100000]))],
        lambda: [f"{n} = " + " ** ".join(["1"] * rng.choice([100, 1000, 10000, 100000]))],
        lambda: [f"{n} = {x}" + ".relu()" * rng.choice([100, 1000, 10000, 100000])],
        lambda: [f"{n} = {x}" + ".T" * rng.choice([100, 1001, 10000])],
        lambda: [f"{n} = {x}" + "[...]" * rng.choice([100, 1000, 10000])],
        lambda: [f"{n} = {x}" + "[none]" * rng.choice([30, 63, 64, 65, 100, 1000])],
        lambda: [f"{n} = randn({', '.join(['1'] * rng.choice([25, 63, 64, 65, 100, 1000, 10000]))})"],
        lambda: nest_blocks(rng.choice(["no_grad {", "checkpoint {", "scope \"s\" {", "autocast(bf16) {", "for i in range(1) {"]),
                            rng.choice([10, 100, 1000, 10000]), f"{n} = {x} * 2"),
        lambda: [f'mark("{"m" * rng.choice([1000, 100000, 1000000])}")'],
        lambda: [f'scope "{"s" * rng.choice([1000, 100000])}" {{', f"    {n} = {x} * 2", "}"],
        lambda: [f"{'v' * rng.choice([1000, 100000])} = {x}"],
        lambda: [f"{n} = {x}  # " + "c" * rng.choice([1000, 1000000])],
        lambda: [f"{n} = randn({rng.choice([' ' * 100000 + '2', '2' + ' ' * 100000])})"],
        lambda: [f"{n} = {'0' * 100000}1"],
        lambda: [f"{n} = 1.{'0' * 100000}1"],
        lambda: [f"{n} = 1e{rng.choice(['999', '-999', '99999999999999999999', ''])}"],
        # loops
        lambda: [f"for i in range({rng.choice(['1000001', str(I64_MAX), '-1', '2**62', '1.5', 'nan', x, '1, 2', '', 'inf'])}) {{", f"    {n} = {x} * i", "}"],
        lambda: [f"for i in range({rng.choice(['1000', '10000', '100000'])}) {{", f"    {n} = randn(16, 16) * i", f"    keep({n})", "}"],
        lambda: [f"for i in range({rng.choice(['10000', '100000', '1000000'])}) {{", f"    {n} = randn(2) * i", "}"],
        lambda: [f"for i in range(3) {{", f"    i = i + {rng.choice(['1', str(I64_MAX)])}", f"    {n} = randn(i + 1)", "}"],
        lambda: [f"for {rng.choice(['i', 'randn', 'none', 'x y', '1', 'λ'])} in range(2) {{", f"    {n} = 1", "}"],
        lambda: [f"for i in {rng.choice(['range', 'range(2', '[1, 2]', x, 'randn(2)'])} {{", f"    {n} = 1", "}"],
        lambda: [f"for i in range(2) {{ {n} = 1 }}"],
        lambda: [f"for i in range(2) {{", f"    del i", "}"],
        # names
        lambda: [f"{n} = undefined_{rng.randrange(100)} + 1"],
        lambda: [f"del {rng.choice(['nope', x + ', ' + x, 'randn', x + '[0]', x + '.T', 'i', '1'])}"],
        lambda: [f"del {x}", f"{n} = {x} * 2"],
        lambda: [f"{rng.choice(['randn', 'relu', 'keep', 'mark', 'range', 'inf', 'none', 'true', 'false', 'bf16', 'float32', 'adam', 'no_grad', 'checkpoint', 'dtype', 'backward', 'i', 'for', 'del', 'in'])} = {rng.choice(['3', x, 'randn(2)', 'none'])}",
                 f"{n} = {rng.choice(['randn(2, 2)', 'relu(' + x + ')', 'keep(' + x + ')', 'randn(2, dtype=bf16)', 'inf + 1', x + '.relu()'])}"],
        lambda: [f"{n} = {x}.{rng.choice(['foo', 'grad.grad', 'shape.shape', 'dtype.dtype', 'T.T.T', 'shape[0].T', 'item().relu()', 'numel().numel()', '__class__', 'requires_grad', 'data', 'device'])}"],
        lambda: [f"{x}.{rng.choice(['shape', 'grad', 'T', 'dtype'])} = {rng.choice(['3', x])}"],
        lambda: [f"{n}, {n}_b = {rng.choice([x, '1', x + '.chunk(3)', x + '.shape', '[1, 2, 3]', '(1, 2)', x + '.split(1)'])}"],
        lambda: [f"{n} = {rng.choice(['(1, 2)', '[1, [2, [3]]]', '{}', '{1: 2}', 'lambda: 1', '1 if 2 else 3', '[x for x in y]', 'a.b.c', '1 < 2 < 3', 'not 1', '1 and 2', '~' + x, x + ' % 2', x + ' // 2', x + ' & ' + x, x + ' | ' + x, x + ' == ' + x, x + ' @= 2', '@' + x, x + '[]', x + '(1)', '1(2)', QA_PLUS, QA_TIMES])}"],
        lambda: [f"{n} {rng.choice(['+=', '-=', '*=', '/=', '@=', '==', ':=', '=='])} {x}"],
        lambda: [f"{x}{rng.choice(['', '.relu()', '[0]', ' + 1', '.shape'])}"],
        lambda: [rng.choice(['}', '{', 'no_grad', 'no_grad {}', 'checkpoint { }', 'autocast(int64) {', 'autocast(bf16, f16) {', 'autocast() {', 'scope {', 'scope 1 {', 'phase x {',
                            'if x {', 'while true {', 'return', 'pass', 'import os', 'def f():', '@decorator', '\\', '"unterminated', "'s'", '\t' + n + ' = 1', n + ' = 1;', n + ' = 1 ; ' + n + ' = 2',
                            '\x00', '\x1b[31m', '\u202e' + n + ' = 1', n + '\u200b = 1', '\ufeff' + n + ' = 1', n + ' = "\\u0000"', n + ' = "\\x"'])]
        + (["}"] if rng.random() < 0.5 else []),
        lambda: [f"autocast({rng.choice(['int64', 'bool', 'float32', 'float64', 'dtype=int8', 'x', '1', 'dtype=bf16, enabled=false', 'bf16'])}) {{", f"    {n} = {x} @ {x}.T" if nd == 2 else f"    {n} = {x} * 2", "}"],
        lambda: [f"{n}_p = {x}.shape[0] * {rng.choice(['2**62', str(I64_MAX), '-1', '0'])}", f"{n} = randn({n}_p)"],
        lambda: [f"{n} = {x}.numel() * {rng.choice([str(I64_MAX), '2**62', '-' + str(I64_MAX)])}"],
        lambda: [f"{n} = {x}.shape[{rng.choice([str(nd), '-' + str(nd + 1), ai(), '0:2', '::-1', 'none'])}]"],
        lambda: [f"{n} = {x}.item()" if numel(t.shape) != 1 else f"{n} = {x}.item() + randn(3)"],
        lambda: [f"{n} = {x}.numel(1)"],
        lambda: [f"{n} = {x}.{rng.choice(['relu', 'sin', 'exp', 'tanh', 'contiguous', 'clone', 't', 'float', 'detach'])}({rng.choice(['1', x, 'dim=0', 'inplace=true'])})"],
        lambda: [f"keep({rng.choice(['', x + ', ' + x, '1', 'none', x + '.shape', QA, x + '.grad'])})"],
        lambda: [f"mark({rng.choice(['', '1', x, QAB, LABX, QQ])})"],
        lambda: [f"empty_cache({rng.choice(['1', x])})"],
        lambda: [f"reset_peak_memory_stats()", f"{n} = randn({rng.choice([str(2**33), str(2**36), str(2**40)])})"],
        lambda: [f"{n}_a = randn({rng.choice(['1024, 1024, 1024', '65536, 65536', str(2**34)])}{rng.choice(['', ', dtype=bf16'])})", f"{n}_b = {n}_a @ {n}_a.T"],
        lambda: [f"{n} = {x}.to({rng.choice(['bf16', 'dtype=bf16, copy=true', DEVCUDA, ''])})"],
        lambda: [f"{n} = {rng.choice(['inf', '-inf'])} * 0", f"{n}_t = randn(2) * {n}"],
        lambda: [f"{n} = randn(2)[{rng.choice(['inf', 'nan', '-inf', '1e308', '0.5'])}]"],
        # wrong arity of methods and functions
        lambda: [f"{n} = {x}.{rng.choice(VIEW_METHODS)}({', '.join(rng.choice(['0', '1', '-1', '2']) for _ in range(rng.choice([0, 0, 1, 3, 5])))})"],
        lambda: [f"{n} = {rng.choice(ALL_FUNCS)}({', '.join(rng.choice([x, '0', '1', 'none', '[' + x + ']', 'dim=0']) for _ in range(rng.choice([0, 1, 2, 3, 6])))})"],
        # reductions over dims outside i8 / small ranges
        lambda: [f"{n} = {x}.{rng.choice(['sum', 'mean', 'argmax', 'all', 'any', 'softmax', 'cumsum', 'squeeze', 'unsqueeze', 'log_softmax'])}("
                 f"{rng.choice(['dim=', ''])}{rng.choice(['127', '128', '-129', '255', '256', '-256', '32767', '65536', str(2**31), '[128]', '[0, 128]', '[' + ', '.join(['0'] * 9) + ']'])})"],
        # huge views made by expand (no memory), then ops over them
        lambda: huge_view(g, n, rng),
        lambda: huge_view(g, n, rng),
        lambda: huge_view(g, n, rng),
        # indexing with several ellipses, new axes and integers past the dimensions
        lambda: [f"{n} = {rng.choice([x, 'randn([])', 'randn(3)', 'randn(2, 3)'])}[{', '.join(rng.choice(['...', 'none', '0', '-1', ':', '1:', '::2', str(I64_MAX), '-' + str(I64_MAX)]) for _ in range(rng.randrange(0, 7)))}]"],
        lambda: [f"{x}[{', '.join(rng.choice(['...', 'none', '0', ':', '::2']) for _ in range(rng.randrange(1, 6)))}] = {rng.choice(['1', x, 'randn(1)'])}"],
        lambda: [f"{n} = arange({rng.choice(['0, ', '', '-inf, ', 'nan, ', '1e308, '])}{rng.choice(['inf', 'nan', '1e308', str(2**62), str(I64_MAX), '1e19', '-1'])}{rng.choice(['', ', 1e-300', ', -1', ', 0.5', ', ' + str(2**62), ', inf'])})"],
        lambda: [f"{n} = conv2d(randn(1, 1, 4, 4), randn(1, 1, {rng.choice(['1, 1', '3, 3'])}), stride={rng.choice(['1', str(2**62), str(I64_MAX)])}, padding={rng.choice(['0', str(2**61), str(2**62), str(I64_MAX), '-' + str(2**62)])}, dilation={rng.choice(['1', str(2**61), str(2**62), str(I64_MAX)])})"],
        lambda: [f"{n} = max_pool2d(randn(1, 1, 4, 4), {rng.choice(['2', str(2**62), str(I64_MAX), '1'])}, stride={rng.choice(['1', str(2**62), 'none'])}, padding={rng.choice(['0', '1', str(2**61), str(2**62), str(I64_MAX)])})"],
        lambda: [f"{n} = adaptive_avg_pool2d(randn(1, 1, 4, 4), {rng.choice([str(2**31), str(2**40), str(2**62), str(I64_MAX), '2**31, 2**31'])})"],
        lambda: [f"{n} = pad(randn(2, 2), {rng.choice([str(2**62), str(I64_MAX), '-' + str(I64_MAX), str(2**62) + ', ' + str(2**62), '-3, 1', '-2, -2'])})"],
        lambda: [f"{n} = randn(2, 2).repeat_interleave({rng.choice([str(2**62), str(I64_MAX), str(2**31), '0', '-1'])}, dim={rng.choice(['0', 'none', '1'])})"],
        lambda: [f"{n} = randn({rng.choice(['4, 4', '2, 3, 4'])}).split({rng.choice(['1', str(I64_MAX), '-1', '-' + str(I64_MAX)])}, dim={rng.choice(['0', '-1', str(I64_MAX)])})"],
        lambda: [f"{n} = randn(4, 4).chunk({rng.choice(['1', str(I64_MAX), '-1', '-' + str(I64_MAX), str(2**40)])})"],
        lambda: [f"{n} = randn(1, 1, 8, 8).expand({rng.choice(['2**20, 2**20, 8, 8', '-1, 2**40, -1, -1'])})", f"{n}_y = conv2d({n}, randn(1, 2**40, 3, 3))"],
        # graphs and traces that grow with a loop
        lambda: [f"{n} = randn(4, requires_grad=true)", f"for i in range({rng.choice(['100000', '1000000'])}) {{", f"    {n} = {n} * 1.0001", "}", f"{n}.sum().backward()"],
        lambda: [f"{n} = randn(4)", f"for i in range({rng.choice(['100000', '1000000'])}) {{", f"    keep({n} * 2)", "}"],
        lambda: [f"{n} = randn(4)", f"for i in range({rng.choice(['100000', '1000000'])}) {{", f"    mark(\"m\")", "}"],
    ]
    return rng.choice(choices)()


VIEW_METHODS = ["transpose", "unsqueeze", "permute", "view", "reshape", "expand", "flatten", "squeeze", "t",
                "split", "chunk", "repeat_interleave", "contiguous", "clone", "detach", "to", "float", "item",
                "numel", "backward", "requires_grad_", "masked_fill", "cumsum", "softmax", "argmax", "max",
                "add_", "mul_", "copy_", "fill_", "zero_", "relu_", "pow", "matmul", "le", "eq", "bitwise_and",
                "all", "any", "sum", "mean", "exp_", "neg", "tril"]
ALL_FUNCS = ["randn", "rand", "zeros", "ones", "empty", "full", "arange", "pow", "le", "cumsum", "all", "where",
             "add", "bitwise_or", "sum", "mean", "argmax", "max", "isin", "matmul", "linear", "addmm",
             "scaled_dot_product_attention", "softmax", "safe_softmax", "log_softmax", "cross_entropy",
             "layer_norm", "rms_norm", "embedding", "dropout", "cat", "stack", "pad", "conv2d", "batch_norm",
             "max_pool2d", "adaptive_avg_pool2d", "keep", "mark", "empty_cache", "reset_peak_memory_stats",
             "synchronize", "sgd", "adam", "adamw", "neg", "tril", "relu", "range", "no_grad", "checkpoint",
             "autocast", "print", "len", "float", "int", "torch", "x"]

HUGE = ["2**31", "2**32", "2**40", "2**62", str(I64_MAX), "2**62, 2**62", "2**40, 2**40", "2**31, 2**31, 2**31"]


def huge_view(g, n, rng):
    """A view of enormous size made without memory (expand), then an op over it."""
    h = rng.choice(HUGE)
    nd = h.count(",") + 1
    base = "randn(" + ", ".join(["1"] * nd) + ")"
    lines = [f"{n} = {base}.expand({h})"]
    e = n
    ops = [
        f"{e}.sum()", f"{e}.mean()", f"{e}.sum(dim=0)", f"{e}.softmax(0)", f"{e}.cumsum(0)", f"{e} + 1",
        f"{e} * {e}", f"{e}.contiguous()", f"{e}.clone()", f"{e}.view(-1)", f"{e}.reshape(-1)",
        f"{e}.flatten()", f"{e}.split(1)", f"{e}.chunk({h.split(',')[0]})", f"{e}.split(2**20)",
        f"cat([{e}, {e}])", f"stack([{e}, {e}])", f"cat([{e}, {e}, {e}, {e}])", f"{e}.repeat_interleave(2**40)",
        f"{e}.repeat_interleave(2)", f"pad({e}, 2**62, 2**62)", f"pad({e}, 1, 1)", f"{e}.unsqueeze(0).expand(2**40, {h})",
        f"{e} @ {e}", f"{e}.T @ {e}", f"matmul({e}, randn(1).expand({h.split(',')[-1]}))", f"linear({e}, randn(1, 1).expand(4, {h.split(',')[-1]}))",
        f"{e}.argmax()", f"{e}.max()", f"isin(randn(4), {e})", f"isin({e}, randn(4))", f"{e}.to(dtype=bf16)",
        f"{e}.eq(0).any()", f"{e}.gt(0).all()", f"layer_norm({e}, none)", f"rms_norm({e})",
        f"dropout({e}, p=0.5)", f"{e}.masked_fill({e}.gt(0), 0)", f"where({e}.gt(0), {e}, 0)",
        f"embedding(zeros(2, dtype=int64), {e})" if nd == 2 else f"embedding(zeros(2, dtype=int64).expand({h}), randn(4, 4))",
        f"cross_entropy({e}, zeros({h.split(',')[0]}, dtype=int64))" if nd == 2 else f"{e}.tril()",
        f"{e}[::{rng.choice(['2', str(2**61), str(I64_MAX)])}]", f"{e}[{rng.choice(['-1', str(2**61), '-' + str(2**61)])}:]",
        f"{e}.transpose(0, -1).contiguous()", f"{e}.numel()", f"{e}.item()",
        f"scaled_dot_product_attention(randn(1, 1, 1, 1).expand(1, 1, {h.split(',')[0]}, 64), randn(1, 1, 1, 64), randn(1, 1, 1, 64))",
        f"conv2d(randn(1, 1, 1, 1).expand(1, 1, {h.split(',')[0]}, 4), randn(1, 1, 3, 3))",
        f"max_pool2d(randn(1, 1, 1, 1).expand(1, 1, {h.split(',')[0]}, 4), 2)",
        f"adaptive_avg_pool2d(randn(1, 1, 1, 1).expand(1, 1, {h.split(',')[0]}, 4), 2)",
        f"batch_norm(randn(1, 1).expand(2, {h.split(',')[0]}), none, none, none, none, training=true)",
    ]
    k = rng.choice([1, 1, 2])
    for i in range(k):
        lines.append(f"{n}_{i} = {rng.choice(ops)}")
    if rng.random() < 0.3:
        lines.append(f"{n}_s = {n}_0.sum()")
    return lines


def nest_call(n, inner, depth, open_, close):
    return f"{n} = " + open_ * depth + inner + close * depth


def nest_blocks(opener, depth, inner):
    lines = []
    for d in range(depth):
        lines.append(" " * min(d, 40) + opener)
    lines.append(" " * min(depth, 40) + inner)
    for d in reversed(range(depth)):
        lines.append(" " * min(d, 40) + "}")
    return lines


def gen_script_workload(rng, idx):
    """A [workload] with random setup and body. Returns (doc dict, argv extras, tag)."""
    cpu = rng.random() < 0.12
    mode = rng.random()
    if mode < 0.3:
        bad, flavour = 0.0, "clean"
    elif mode < 0.8:
        bad, flavour = 0.04, "light"
    else:
        bad, flavour = 0.2, "heavy"
    g = ScriptGen(rng, cpu=cpu, bad_rate=bad, big=rng.random() < 0.3)
    g.statements(rng.randrange(2, 10))
    setup = list(g.lines)
    g.lines = []
    g.forget_graph()
    nbody = rng.randrange(3, 30)
    g.statements(nbody)
    if bad > 0 and rng.random() < 0.5:
        # one late adversarial statement, after the engine has state
        for line in adversarial_statement(g):
            g.emit(line)
    if rng.random() < 0.4:
        g.st_backward()
    body = list(g.lines)
    wl = {"name": f"stress {idx}"}
    r = rng.random()
    if bad == 0:
        r = r * 0.7
    if r < 0.7:
        wl["iterations"] = rng.choice([1, 1, 2, 3, 4, 5])
    elif r < 0.8:
        wl["iterations"] = rng.choice([0, -1, I64_MAX, 10000, 10001, 2**32, 1.5, "3", RawToml("nan")])
    if rng.random() < 0.3 and bad == 0:
        wl["capacity"] = rng.choice(["24GiB", "1GiB", "100MiB", "80GiB", "1.5GiB", 2**40, 2**30])
    elif bad and rng.random() < 0.3:
        wl["capacity"] = rng.choice(["24GiB", "1GiB", "100MiB", "80GiB", "0", "1B", "1KiB", "-1GiB", "1e30GiB",
                                     "16EiB", "18446744073709551615", "nanGiB", "1.5GiB", "1 GiB", "", 0, -1,
                                     I64_MAX, 2**40, 1.5, RawToml("inf")])
    if rng.random() < 0.2 and bad == 0:
        wl["alloc_conf"] = rng.choice(["expandable_segments:True", "max_split_size_mb:128", "garbage_collection_threshold:0.8",
                                       "roundup_power2_divisions:4", "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
                                       "expandable_segments:True,max_split_size_mb:20"])
    elif bad and rng.random() < 0.2:
        wl["alloc_conf"] = rng.choice([
            "expandable_segments:True", "max_split_size_mb:128", "max_split_size_mb:0", "max_split_size_mb:1",
            "garbage_collection_threshold:0.8", "garbage_collection_threshold:1.5", "roundup_power2_divisions:4",
            "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]", "roundup_power2_divisions:[>:0]",
            "roundup_power2_divisions:3", "max_split_size_mb:" + str(I64_MAX), "expandable_segments:True,max_split_size_mb:20",
            "pinned_use_cuda_host_register:True", "backend:cudaMallocAsync", ",,,", "a:b:c", "max_split_size_mb:-1",
            "roundup_power2_divisions:[" + ",".join(f"{2**i}:1" for i in range(40)) + "]",
        ])
    if cpu:
        wl["device"] = "cpu"
    elif bad and rng.random() < 0.03:
        wl["device"] = rng.choice(["cuda", "CPU", "", "sim", 1])
    params = {}
    if rng.random() < 0.15:
        params = {"batch": rng.choice([1, 4] if bad == 0 else [1, 4, 0, -1, I64_MAX, 2**40])}
        body.insert(0, "pb = randn(batch, 8)")
    encode = rng.random()
    if encode < 0.02:
        # setup given as an array of lines (wrong type) or body missing
        wl["setup"] = setup
    else:
        wl["setup"] = "\n".join(setup)
    wl["body"] = "\n".join(body)
    doc = {"workload": wl}
    if params:
        doc["params"] = params
    extra = random_flags(rng, cpu, valid=bad == 0)
    return doc, extra, flavour + (" cpu" if cpu else "")


def random_flags(rng, cpu, valid=False):
    flags = []
    r = rng.random()
    if r < 0.15:
        flags.append("--json")
    if rng.random() < 0.1:
        flags += ["--report", rng.choice(["all", "fragmentation", "leaks"])]
    if rng.random() < 0.08:
        flags += ["--plot", "out.svg"]
    if rng.random() < 0.08:
        flags += ["--snapshot", "snap.json"]
    if rng.random() < 0.05:
        flags.append("--torch-style")
    if rng.random() < 0.08:
        flags += ["--fail-on", "oom,leak"]
    if rng.random() < 0.3:
        flags.append("--no-remedies")
    if rng.random() < 0.05:
        flags += ["--iterations", rng.choice(["1", "4"] if valid else ["1", "4", "0", "10001", str(I64_MAX), "-1"])]
    if rng.random() < 0.05:
        flags += ["--capacity", rng.choice(["1GiB", "100MiB"] if valid else ["1GiB", "0", "1B", "16EiB", "x"])]
    if rng.random() < 0.04:
        flags += ["--alloc-conf", rng.choice(["expandable_segments:True"] if valid else ["expandable_segments:True", "max_split_size_mb:0", "bogus"])]
    if cpu and rng.random() < 0.2:
        flags += ["--save-grads", "grads.safetensors"]
    if rng.random() < 0.03 and not valid:
        flags += ["--param", rng.choice(["batch=2", "batch=-1", "nope=1", "batch", "=1", "batch=9223372036854775808"])]
    return flags


# --------------------------------------------------------------------------------------------
# Fixture mutations
# --------------------------------------------------------------------------------------------

LONG = "y" * 100_000
MUT_VALUES = [
    ("-1", -1), ("0", 0), ("i64max", I64_MAX), ("i64min", I64_MIN), ("1e308", 1e308),
    ("nan", RawToml("nan")), ("inf", RawToml("inf")), ("-0.0", -0.0), ("text", "text"), ("empty-str", ""),
    ("[]", []), ("{}", InlineTable()), ("true", True), ("long-str", LONG),
]
BOUNDARY = {
    "iterations": [10000, 10001, 9999], "layers": [10000, 10001, 1000], "grad_accum": [1024, 1025, 1000],
    "new_tokens": [1000000, 1000001, 100000, 20000], "num_hidden_layers": [10000, 1000],
}
PATH_KEYS = ("hf_config", "weights", "file")


def flatten(doc, prefix=()):
    for k, v in doc.items():
        if type(v) is dict:
            yield from flatten(v, prefix + (k,))
        else:
            yield prefix + (k,), v


def get_path(doc, path):
    for p in path[:-1]:
        doc = doc[p]
    return doc[path[-1]]


def set_path(doc, path, value):
    for p in path[:-1]:
        doc = doc.setdefault(p, {})
        if type(doc) is not dict:
            return False
    doc[path[-1]] = value
    return True


def del_path(doc, path):
    d = doc
    for p in path[:-1]:
        d = d[p]
    del d[path[-1]]


def fixture_files():
    pats = ["fixtures/workloads/**/*.toml", "fixtures/hf/workloads/*.toml", "fixtures/vision/**/*.toml",
            "fixtures/seeds/*.toml", "fixtures/cpu/*.toml", "fixtures/hf/bench/*.toml"]
    out = []
    for p in pats:
        out += sorted(REPO.glob(p))
    seen = set()
    res = []
    for f in out:
        if f not in seen:
            seen.add(f)
            res.append(f)
    return res


def absolutize(doc, src_dir):
    """Rewrites referenced files (hf_config, weights, data file) to absolute paths."""
    for path, v in list(flatten(doc)):
        if path[-1] in PATH_KEYS and isinstance(v, str):
            p = (src_dir / v)
            if p.exists():
                set_path(doc, path, str(p.resolve()))


def type_aware_values(key, v):
    vals = []
    if key in BOUNDARY:
        vals += [(f"boundary-{x}", x) for x in BOUNDARY[key]]
    if isinstance(v, bool):
        vals += [("int-for-bool", 1), ("str-true", "true")]
    elif isinstance(v, int):
        vals += [("x2", v * 2), ("x1000", v * 1000), ("x1e6", v * 1_000_000), ("2**31", 2**31), ("2**40", 2**40),
                 ("1", 1), ("3", 3), ("7", 7), ("float", float(v) + 0.5), ("str-int", str(v)), ("+1", v + 1)]
    elif isinstance(v, float):
        vals += [("x2", v * 2), ("-x", -v), ("1", 1.0), ("int", int(v) if not math.isnan(v) else 0),
                 ("1.5", 1.5), ("2", 2.0)]
    elif isinstance(v, str):
        vals += [("upper", v.upper()), ("suffix", v + "x"), ("space", " " + v), ("nul", v + "\u0000"),
                 ("unicode", v + "é"), ("dot", ".")]
        if key == "capacity":
            vals += [(c, c) for c in ["1B", "0GiB", "1KiB", "16EiB", "1e30GiB", "-1GiB", "nanGiB", "1.5.5GiB",
                                       "100MiB", "18446744073709551616", "1 GiB", "GiB", "1TiB"]]
        if key in ("optimizer", "precision", "mode", "attention", "dtype", "torchvision", "kind", "keep_loss"):
            vals += [(c, c) for c in ["sgd", "sgd_momentum", "adam", "adamw", "none", "fp32", "bf16-autocast",
                                       "bf16", "train", "inference", "generate", "eval-with-graph", "eager", "sdpa",
                                       "math", "mlp", "gpt", "resnet18", "resnet1000", "tensor", "item", "fp16"]]
        if key in ("hf_config", "weights", "file"):
            vals += [(c, c) for c in ["/nonexistent/config.json", "/dev/null", "/dev/zero", "/tmp", "/proc/self/mem",
                                       "../" * 50, "config.json\u0000", "/etc/passwd", "~/x.json", ""]]
    elif isinstance(v, list):
        vals += [("list-int", [1, 2]), ("list-nested", [[v]]), ("list-dup", v + v), ("list-empty-str", [""]),
                 ("list-long", ["q_proj"] * 10000)]
    return vals


def mutate_fixture(rng, path):
    """Returns (label, text, keys-for-names, write_config) for a mutation of the fixture."""
    text = path.read_text()
    doc = tomllib.loads(text)
    absolutize(doc, path.parent)
    keys = [p for p, _ in flatten(doc)]
    tables = [k for k, v in doc.items() if type(v) is dict]
    op = rng.random()
    labels = []
    names = set()
    if op < 0.55 and keys:
        for key in rng.sample(keys, min(len(keys), rng.choice([1, 1, 1, 2, 3]))):
            v = get_path(doc, key)
            opts = MUT_VALUES + type_aware_values(key[-1], v)
            if key[-1] in ("setup", "body") and isinstance(v, str):
                opts += [("script-mutation", None)] * 12
            lab, nv = rng.choice(opts)
            if lab == "script-mutation":
                nv, lab = mutate_script(rng, v)
            set_path(doc, key, nv)
            labels.append(f"{'.'.join(key)}={lab}")
            names.add(key[-1])
        body = toml_dump(doc, rng)
    elif op < 0.65 and keys:
        key = rng.choice(keys)
        del_path(doc, key)
        labels.append(f"remove {'.'.join(key)}")
        names.add(key[-1])
        body = toml_dump(doc, rng)
    elif op < 0.72 and tables:
        tname = rng.choice(tables)
        body = toml_dump(doc, rng)
        sub = toml_dump({tname: doc[tname]})
        body += "\n" + sub
        labels.append(f"duplicate [{tname}]")
        names.add(tname)
    elif op < 0.85:
        # an unknown key, or a known key where it does not belong
        cand = [("workload", "unknown_key", 1), ("model", "unknown_key", "x"), ("train", "unknown_key", 1),
                ("nonsense_table", "k", 1), ("workload", "device", "cpu"), ("workload", "device", "cuda"),
                ("train", "grad_accum", rng.choice([2, 0, 1024, 1025])), ("train", "checkpointing", True),
                ("train", "precision", "bf16-autocast"), ("train", "mode", rng.choice(["generate", "inference", "eval-with-graph"])),
                ("generate", "new_tokens", rng.choice([1, 0, 64, 1000000])), ("generate", "min_new_tokens", rng.choice([0, 5, 1000])),
                ("generate", "pad_token_id", rng.choice([-1, 0, I64_MAX, 16000])),
                ("model", "gradient_checkpointing", True), ("model", "attention", rng.choice(["eager", "math", "flash"])),
                ("model", "dtype", rng.choice(["bf16", "fp16", "fp32"])),
                ("model", "lora", {"r": rng.choice([0, 1, 16, I64_MAX]), "alpha": rng.choice([0, 32, -1]),
                                   "target_modules": rng.choice([["q_proj"], [], ["nope"], ["lm_head"], ["c_attn"]])}),
                ("model", "torchvision", rng.choice(["resnet18", "resnet50", "vit_b_16"])),
                ("model", "image_size", rng.choice([1, 7, 31, 32, 0, 100000])), ("model", "num_classes", rng.choice([0, 1, 10**9])),
                ("model", "hf_config", str(REPO / "fixtures/hf/cases/llama_t.config.json")),
                ("model", "kind", rng.choice(["gpt", "mlp"])), ("params", "batch", rng.choice([2, -1, 0])),
                ("check", "x", 1), ("data", "file", "/nonexistent.safetensors"),
                ("workload", "body", "x = randn(2)"), ("workload", "setup", "x = randn(2)\ny = x @ x"),
                ("workload", "iterations", rng.choice([4, 10000])), ("workload", "alloc_conf", "expandable_segments:True"),
                ("train", "batch", rng.choice([1, 0, 4096, 2**31])), ("train", "seq", rng.choice([1, 2, 4096, 2**20, 0])),
                ("train", "iterations", rng.choice([1, 10000, 0])), ("train", "keep_loss", "tensor"),
                ("train", "retain_graph", True), ("train", "optimizer", rng.choice(["sgd", "none", "lion"]))]
        t, k, v = rng.choice(cand)
        if t in doc and type(doc[t]) is not dict:
            pass
        set_path(doc, (t, k), v)
        labels.append(f"add [{t}] {k}={v!r}"[:120])
        names.update([t, k])
        body = toml_dump(doc, rng)
    else:
        # textual mutations of the file itself
        body = toml_dump(doc, rng)
        r = rng.randrange(6)
        if r == 0:
            cut = rng.randrange(len(body))
            body = body[:cut]
            labels.append(f"truncate at {cut}")
        elif r == 1:
            body = "\ufeff" + body
            labels.append("BOM")
        elif r == 2:
            body = body.replace("\n", "\r\n")
            labels.append("CRLF")
        elif r == 3:
            i = rng.randrange(len(body))
            body = body[:i] + rng.choice(["\x00", "\"", "[", "]]", "=", "\n[workload]\n", "\\u", "é"]) + body[i:]
            labels.append(f"insert garbage at {i}")
        elif r == 4:
            body = body + "\n" + "[a]\n" * 2
            labels.append("duplicate [a]")
        else:
            body = body + "\nworkload.name = 'again'\n"
            labels.append("dotted redefinition")
    return "; ".join(labels) or "unchanged", body, names


def mutate_script(rng, script):
    lines = script.split("\n")
    r = rng.randrange(7)
    if r == 0 and lines:
        i = rng.randrange(len(lines))
        del lines[i]
        lab = f"script: delete line {i + 1}"
    elif r == 1 and lines:
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
        lab = f"script: duplicate line {i + 1}"
    elif r == 2 and len(lines) > 1:
        i, j = rng.sample(range(len(lines)), 2)
        lines[i], lines[j] = lines[j], lines[i]
        lab = f"script: swap lines {i + 1},{j + 1}"
    elif r == 3:
        # numbers in the script replaced by adversarial ones
        nums = list(re.finditer(r"(?<![\w.])\d+(?![\w.])", script))
        if nums:
            m = rng.choice(nums)
            rep = rng.choice(["0", "-1", str(2**31), str(2**40), str(I64_MAX), "1"])
            return script[:m.start()] + rep + script[m.end():], f"script: number {m.group()}->{rep}"
        lab = "script: none"
    else:
        # an adversarial or random statement, knowing nothing of the script's names
        g = ScriptGen(rng, bad_rate=0.5)
        for name in set(re.findall(r"^\s*([A-Za-z_]\w*)\s*=", script, re.M)):
            g.vars[name] = T(None)
        g.statements(rng.randrange(1, 4))
        i = rng.randrange(len(lines) + 1)
        lines[i:i] = g.lines
        lab = f"script: insert {len(g.lines)} lines at {i + 1}"
    return "\n".join(lines), lab


# --------------------------------------------------------------------------------------------
# Hugging Face config mutations
# --------------------------------------------------------------------------------------------


def hf_mutation(rng, cfg):
    """Mutates a config dict in place; returns a label."""
    mt = cfg.get("model_type", "")
    heads_key = "n_head" if mt == "gpt2" else "num_attention_heads"
    hidden_key = "n_embd" if mt == "gpt2" else "hidden_size"
    heads = cfg.get(heads_key, 8) or 8
    muts = [
        ("hidden not divisible", lambda: cfg.__setitem__(hidden_key, heads * 7 + 1)),
        ("kv heads 0", lambda: cfg.__setitem__("num_key_value_heads", 0)),
        ("kv heads > heads", lambda: cfg.__setitem__("num_key_value_heads", heads * 2)),
        ("kv heads not divisor", lambda: cfg.__setitem__("num_key_value_heads", 3)),
        ("kv heads -1", lambda: cfg.__setitem__("num_key_value_heads", -1)),
        ("kv heads null", lambda: cfg.__setitem__("num_key_value_heads", None)),
        ("heads 0", lambda: cfg.__setitem__(heads_key, 0)),
        ("heads -1", lambda: cfg.__setitem__(heads_key, -1)),
        ("heads huge", lambda: cfg.__setitem__(heads_key, 2**40)),
        ("hidden 0", lambda: cfg.__setitem__(hidden_key, 0)),
        ("hidden huge", lambda: cfg.__setitem__(hidden_key, 2**40)),
        ("vocab -1", lambda: cfg.__setitem__("vocab_size", -1)),
        ("vocab 0", lambda: cfg.__setitem__("vocab_size", 0)),
        ("vocab 1", lambda: cfg.__setitem__("vocab_size", 1)),
        ("vocab huge", lambda: cfg.__setitem__("vocab_size", rng.choice([2**31, 2**40, I64_MAX, 2**64]))),
        ("vocab float", lambda: cfg.__setitem__("vocab_size", 16000.5)),
        ("intermediate huge", lambda: cfg.__setitem__("n_inner" if mt == "gpt2" else "intermediate_size", rng.choice([2**40, 2**62, I64_MAX]))),
        ("intermediate 0", lambda: cfg.__setitem__("n_inner" if mt == "gpt2" else "intermediate_size", 0)),
        ("intermediate -1", lambda: cfg.__setitem__("n_inner" if mt == "gpt2" else "intermediate_size", -1)),
        ("rope_scaling garbage", lambda: cfg.__setitem__("rope_scaling", rng.choice([
            "abc", 1, [], {"type": "yarn", "factor": -1}, {"rope_type": "linear", "factor": 0},
            {"rope_type": "dynamic", "factor": 2.0}, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 0},
            {"rope_type": "nope"}, {}, None]))),
        ("rope_parameters garbage", lambda: cfg.__setitem__("rope_parameters", rng.choice([
            {"rope_theta": 0.0, "rope_type": "default"}, {"rope_theta": -1.0, "rope_type": "default"},
            {"rope_theta": float("nan"), "rope_type": "default"}, {"rope_type": "yarn", "factor": 4.0},
            {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0, "low_freq_factor": 1.0,
             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            {"rope_type": "default"}, {"rope_theta": 1e308}, "x", [], None,
            {"rope_type": "linear", "factor": 0, "rope_theta": 10000.0}]))),
        ("rope_theta", lambda: cfg.__setitem__("rope_theta", rng.choice([0, -1, 1e308, "x"]))),
        ("head_dim 0", lambda: cfg.__setitem__("head_dim", 0)),
        ("head_dim -1", lambda: cfg.__setitem__("head_dim", -1)),
        ("head_dim odd", lambda: cfg.__setitem__("head_dim", rng.choice([1, 3, 63, 65, 2**40]))),
        ("head_dim null", lambda: cfg.__setitem__("head_dim", None)),
        ("sliding_window -1", lambda: cfg.__setitem__("sliding_window", -1)),
        ("sliding_window 0", lambda: cfg.__setitem__("sliding_window", 0)),
        ("sliding_window 1", lambda: cfg.__setitem__("sliding_window", 1)),
        ("sliding_window huge", lambda: cfg.__setitem__("sliding_window", I64_MAX)),
        ("sliding_window str", lambda: cfg.__setitem__("sliding_window", "4096")),
        ("use_sliding_window", lambda: cfg.__setitem__("use_sliding_window", True)),
        ("model_type unknown", lambda: cfg.__setitem__("model_type", rng.choice(["gptx", "", "LLAMA", "llama4", "t5", "mixtral"]))),
        ("model_type number", lambda: cfg.__setitem__("model_type", 5)),
        ("model_type removed", lambda: cfg.pop("model_type", None)),
        ("model_type swap", lambda: cfg.__setitem__("model_type", rng.choice(["llama", "mistral", "qwen2", "gpt2", "bert"]))),
        ("layers 0", lambda: cfg.__setitem__("n_layer" if mt == "gpt2" else "num_hidden_layers", 0)),
        ("layers limit", lambda: cfg.__setitem__("n_layer" if mt == "gpt2" else "num_hidden_layers", rng.choice([10000, 10001, 2000]))),
        ("max positions 1", lambda: cfg.__setitem__("n_positions" if mt == "gpt2" else "max_position_embeddings", rng.choice([0, 1, -1]))),
        ("tie str", lambda: cfg.__setitem__("tie_word_embeddings", "yes")),
        ("act unknown", lambda: cfg.__setitem__("activation_function" if mt == "gpt2" else "hidden_act", rng.choice(["swish2", "", "gelu_new", "relu", "gelu_pytorch_tanh", 1]))),
        ("dtype", lambda: cfg.__setitem__(rng.choice(["torch_dtype", "dtype"]), rng.choice(["float8", "bfloat16", "float16", "int8", 1, None]))),
        ("pad id", lambda: cfg.__setitem__("pad_token_id", rng.choice([-1, 2**40, I64_MAX, "0", 16000, [0, 1]]))),
        ("eos ids", lambda: cfg.__setitem__("eos_token_id", rng.choice([[], [-1], [2**40], [2] * 1000, None, "2", [[2]], -5]))),
        ("bos id", lambda: cfg.__setitem__("bos_token_id", rng.choice([-1, 2**40, None, 1.5]))),
        ("type vocab 0", lambda: cfg.__setitem__("type_vocab_size", rng.choice([0, -1, 2**40]))),
        ("labels", lambda: cfg.__setitem__("num_labels", rng.choice([0, -1, 2**40]))),
        ("id2label", lambda: cfg.__setitem__("id2label", rng.choice([{}, {"0": "a"}, {str(i): "l" for i in range(1000)}, [], "x"]))),
        ("eps", lambda: cfg.__setitem__(rng.choice(["rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"]), rng.choice([-1, 0, float("nan"), "x"]))),
        ("dropout", lambda: cfg.__setitem__(rng.choice(["attention_dropout", "hidden_dropout_prob", "attn_pdrop", "resid_pdrop", "embd_pdrop"]), rng.choice([-0.5, 1.0, 1.5, float("nan")]))),
        ("bias", lambda: cfg.__setitem__(rng.choice(["attention_bias", "mlp_bias"]), rng.choice([True, "true", 1]))),
        ("quantization", lambda: cfg.__setitem__("quantization_config", {"bits": 4})),
        ("unknown key", lambda: cfg.__setitem__("totally_unknown_key", 1)),
        ("architectures", lambda: cfg.__setitem__("architectures", rng.choice([[], ["Nope"], "LlamaForCausalLM", None, ["LlamaModel"]]))),
        ("remove random key", lambda: cfg.pop(rng.choice(sorted(cfg)), None) if cfg else None),
        ("random key adversarial", lambda: cfg.__setitem__(rng.choice(sorted(cfg)) if cfg else "x", rng.choice([-1, 0, I64_MAX, 1e308, float("nan"), "text", [], {}, True, None, "y" * 100000]))),
    ]
    labs = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        lab, f = rng.choice(muts)
        f()
        labs.append(lab)
    return "; ".join(labs)


def hf_json_text(rng, cfg):
    text = json.dumps(cfg, indent=2, allow_nan=True)  # NaN as JSON's non-standard literal
    r = rng.random()
    if r < 0.03:
        text = text.replace('"vocab_size"', '"vocab_size": 1, "vocab_size"', 1)
    elif r < 0.05:
        text = "[" * 100000 + "]" * 100000
    elif r < 0.07:
        text = text[: rng.randrange(len(text))]
    elif r < 0.09:
        text = text.replace("16000", "1e400")
    return text


# --------------------------------------------------------------------------------------------
# Targeted probes: fixed families where the engine's arithmetic or loops meet their edges
# --------------------------------------------------------------------------------------------


def script_doc(body, **wl):
    w = {"name": "probe", "iterations": 1}
    w.update(wl)
    w["body"] = body
    return {"workload": w}


WEIRD_LABELS = ["", " ", "\t", "a\nb", "\u001b[31mred\u001b[0m", "\u202eevil", "e\u0301" * 50, "名前" * 200,
                "🙂" * 100, "x" * 100000, "%s%n{}", "<svg onload=1>&amp;", "\u0000", "\\", "\"", "a" + "\u200b" * 1000]
OUT_FLAGS = [[], ["--json"], ["--torch-style"], ["--report", "all", "--iterations", "4"], ["--plot", "out.svg"],
             ["--snapshot", "snap.json"], ["--fail-on", "oom,leak", "--iterations", "4"]]
ALLOC_CONFS = [
    "max_split_size_mb:20", "max_split_size_mb:18446744073709551615", "max_split_size_mb:18446744073709551616",
    "max_non_split_rounding_mb:20", "max_non_split_rounding_mb:18446744073709551615",
    "roundup_power2_divisions:1", "roundup_power2_divisions:2", "roundup_power2_divisions:1024",
    "roundup_power2_divisions:1099511627776", "roundup_power2_divisions:9223372036854775808",
    "roundup_power2_divisions:[1:1024,>:9223372036854775808]", "roundup_power2_divisions:[>:1]",
    "roundup_power2_divisions:[0:2]", "roundup_power2_divisions:[1:2,1:4]",
    "roundup_power2_divisions:[18446744073709551615:2]", "roundup_power2_divisions:[" + ",".join(f"{2**i}:2" for i in range(20)) + "]",
    "large_segment_size_mb:11", "large_segment_size_mb:18446744073709551615", "large_segment_size_mb:1099511627776",
    "per_process_memory_fraction:0", "per_process_memory_fraction:1e-300", "per_process_memory_fraction:1",
    "per_process_memory_fraction:0.5", "per_process_memory_fraction:nan", "per_process_memory_fraction:-0",
    "garbage_collection_threshold:1e-300", "garbage_collection_threshold:0.9999999999",
    "expandable_segments:True,per_process_memory_fraction:0.01", "expandable_segments:True,large_segment_size_mb:18446744073709551615",
    "expandable_segments:True,max_split_size_mb:20,garbage_collection_threshold:0.5,roundup_power2_divisions:[>:1024]",
    "expandable_segments:True,max_split_size_mb:20,per_process_memory_fraction:1e-9",
    "pinned_num_register_threads:128", "pinned_reserve_segment_size_mb:18446744073709551615",
]
CAPACITIES = ["1B", "511B", "1KiB", "1MiB", "100MiB", "500MiB", "512MiB", "513MiB", "528MiB", "600MiB", "1GiB",
              "64TiB", "70368744177664", "70368744177665"]
PARAM_VALUES = ["0", "1", "2", "3", "7", "2147483648", "1099511627776", "4611686018427387904", str(I64_MAX), "-1"]
PARAM_FIXTURES = [
    ("fixtures/workloads/presets/mlp_adam.toml", ["batch", "d_in", "hidden", "layers", "d_out", "grad_accum"]),
    ("fixtures/workloads/presets/gpt2_small_sdpa_adamw.toml", ["batch", "seq", "d_model", "heads", "vocab", "layers"]),
    ("fixtures/hf/workloads/llama_t_sdpa_adamw_fp32.toml", ["batch", "seq"]),
    ("fixtures/hf/workloads/llama_t_generate_bf16.toml", ["batch", "seq", "new_tokens"]),
    ("fixtures/hf/workloads/bert_t_cls_adamw_fp32.toml", ["batch", "seq"]),
    ("fixtures/hf/workloads/gpt2_t_sdpa_adamw_fp32.toml", ["batch", "seq"]),
    ("fixtures/hf/workloads/mistral_t_sdpa_adamw_fp32.toml", ["batch", "seq"]),
    ("fixtures/vision/workloads/resnet18_b16_adamw_bf16amp.toml", ["batch", "image_size", "num_classes"]),
    ("fixtures/workloads/parse/eval_keeps_loss.toml", ["batch"]),
]


def targeted_extra():
    """Output formats with odd labels, allocator settings at their edges, tiny cards, parameter
    sweeps of the fixtures: (label, doc, extra argv, files)."""
    out = []
    for i, lab in enumerate(WEIRD_LABELS):
        flags = OUT_FLAGS[i % len(OUT_FLAGS)]
        body = (f"w = randn(64, 64, requires_grad=true)\nscope \"{lab}\" {{\n    y = (w @ w).relu()\n}}\n"
                f"mark(\"{lab}\")\nloss = y.sum()\nloss.backward()\nkeep(loss)")
        out.append((f"weird label #{i} {flags}", script_doc(body, name=lab if lab.strip() else "n", iterations=4), flags, None))
        flags2 = OUT_FLAGS[(i + 3) % len(OUT_FLAGS)]
        out.append((f"weird label #{i} {flags2} (name only)", script_doc("x = randn(4)\nmark(\"m\")", name=lab if lab.strip() else "n"), flags2, None))
    fixtures = ["fixtures/workloads/fragmentation_oom.toml", "fixtures/workloads/presets/x_mlp_tiny_adamw.toml",
                "fixtures/hf/workloads/llama_t_sdpa_adamw_fp32.toml", "fixtures/vision/workloads/resnet18_b16_adamw_bf16amp.toml"]
    script = ("a = randn(1000000)\nb = randn(3000000)\nc = randn(5000)\ndel a\nd = randn(7000000)\n"
              "e = randn(100, 100, 100)\nf = randn(1)\ndel b, d\ng = randn(20000000)\nempty_cache()\nh = randn(9)")
    for conf in ALLOC_CONFS:
        for f in fixtures:
            out.append((f"alloc_conf {conf[:60]} on {f}", None, ["run", str(REPO / f), "--alloc-conf", conf], {}))
        out.append((f"alloc_conf {conf[:60]} on a script", script_doc(script, capacity="200MiB", alloc_conf=conf), ["--report", "fragmentation"], None))
    for cap in CAPACITIES:
        for f in fixtures + ["fixtures/workloads/presets/mlp_adam.toml", "fixtures/hf/workloads/llama_t_generate_bf16.toml"]:
            out.append((f"capacity {cap} on {f}", None, ["run", str(REPO / f), "--capacity", cap], {}))
        out.append((f"capacity {cap} on a script", script_doc(script, capacity=cap), [], None))
    for f, keys in PARAM_FIXTURES:
        for k in keys:
            for v in PARAM_VALUES:
                out.append((f"--param {k}={v} on {f}", None, ["run", str(REPO / f), "--param", f"{k}={v}", "--no-remedies"], {}))
    return out


def targeted_cases(rng, skip_slow=False):
    """(label, doc-or-text, extra argv, files) for the fixed probes."""
    out = []
    # huge expanded views under every op family
    for h in ["2**40", str(I64_MAX), "2**40, 2**40"]:
        nd = h.count(",") + 1
        g = ScriptGen(random.Random(0))
        # enumerate huge_view's op list by drawing with a fixed rng until each appears
        ops = huge_view_ops(h, nd)
        for op in ops:
            body = f"e = randn({', '.join(['1'] * nd)}).expand({h})\ny = {op}"
            out.append((f"huge view {h}: {op}"[:150], script_doc(body), [], None))
    for op in ["e.sum()", "e.softmax(0)", "e.clone()", "e.cumsum(0)", "e @ e"]:
        body = f"e = randn(1).expand(2**31)\ny = {op}"
        out.append((f"cpu huge view 2**31: {op}", script_doc(body, device="cpu"), [], None))
    # reductions over dims past i8
    for op in ["sum", "mean", "argmax", "all", "any", "softmax", "log_softmax", "cumsum", "squeeze", "unsqueeze", "flatten", "transpose"]:
        for d in ["127", "128", "-129", "256", str(2**31), str(I64_MAX), f"-{I64_MAX}"]:
            arg = f"dim={d}" if op not in ("cumsum", "unsqueeze", "flatten", "transpose") else (f"{d}, 0" if op in ("flatten", "transpose") else d)
            out.append((f"{op} dim {d}", script_doc(f"x = randn(2, 3)\ny = x.{op}({arg})"), [], None))
    for d in ["[128]", "[0, 128]", "[0, -129]", "[" + ", ".join(map(str, range(9))) + "]"]:
        out.append((f"sum dim {d}", script_doc(f"x = randn(2, 3)\ny = x.sum(dim={d})"), [], None))
    # arity of every method and function
    for m in VIEW_METHODS:
        for args in ["", "0", "0, 1, 2", "0, 1, 2, 3, 4, 5, 6, 7, 8"]:
            out.append((f"x.{m}({args})", script_doc(f"x = randn(2, 3, requires_grad=true)\ny = x.{m}({args})"), [], None))
    for f in ALL_FUNCS:
        for args in ["", "x", "x, x, x, x, x, x, x, x, x"]:
            out.append((f"{f}({args})", script_doc(f"x = randn(2, 3)\ny = {f}({args})"), [], None))
    if skip_slow:
        return out
    # the documented count bounds, alone and together
    for fixture, edits in [
        ("fixtures/workloads/presets/x_mlp_tiny_adamw.toml", {("model", "layers"): 10000}),
        ("fixtures/workloads/presets/x_mlp_tiny_adamw.toml", {("train", "grad_accum"): 1024}),
        ("fixtures/workloads/presets/x_mlp_tiny_adamw.toml", {("train", "iterations"): 10000}),
        ("fixtures/workloads/presets/x_mlp_tiny_adamw.toml", {("train", "iterations"): 10000, ("train", "grad_accum"): 1024}),
        ("fixtures/hf/workloads/llama_t_generate_bf16.toml", {("generate", "new_tokens"): 1000000, ("train", "iterations"): 1}),
        ("fixtures/hf/workloads/llama_t_generate_bf16.toml", {("generate", "new_tokens"): 100000, ("train", "iterations"): 1}),
    ]:
        fp = REPO / fixture
        if not fp.exists():
            continue
        doc = tomllib.loads(fp.read_text())
        absolutize(doc, fp.parent)
        for path, v in edits.items():
            set_path(doc, path, v)
        out.append((f"bounds {fixture}: {edits}", doc, ["--no-remedies"], None))
    gpt2 = REPO / "fixtures/hf/cases/gpt2_t.config.json"
    llama = REPO / "fixtures/hf/cases/llama_t.config.json"
    for cfgp, key in [(gpt2, "n_layer"), (llama, "num_hidden_layers")]:
        if cfgp.exists():
            cfg = json.loads(cfgp.read_text())
            cfg[key] = 10000
            out.append((f"bounds {cfgp.name}: {key}=10000 (bare, batch 1, seq 16)", None,
                        ["run", "config.json", "--batch", "1", "--seq", "16", "--iterations", "1", "--no-remedies"],
                        {"config.json": json.dumps(cfg, indent=1)}))
    # loops whose product is unbounded
    out.append(("nested range(10**6) x range(10**6)", script_doc(
        "x = randn(4)\nfor i in range(1000000) {\n    for j in range(1000000) {\n        y = x * 2\n    }\n}"), [], None))
    out.append(("iterations 10000 x range(10**6)", script_doc(
        "x = randn(4)\nfor i in range(1000000) {\n    y = x * 2\n}", iterations=10000), ["--no-remedies"], None))
    out.append(("graph growth: range(10**6) x range(10**6) of x = x * c", script_doc(
        "x = randn(4, requires_grad=true)\nfor i in range(1000000) {\n    for j in range(1000000) {\n        x = x * 1.0001\n    }\n}"), [], None))
    return out


def huge_view_ops(h, nd):
    first, last = h.split(",")[0].strip(), h.split(",")[-1].strip()
    e = "e"
    return [
        f"{e}.sum()", f"{e}.mean()", f"{e}.sum(dim=0)", f"{e}.softmax(0)", f"{e}.cumsum(0)", f"{e} + 1",
        f"{e} * {e}", f"{e}.contiguous()", f"{e}.view(-1)", f"{e}.reshape(-1)", f"{e}.flatten()",
        f"{e}.split(1)", f"{e}.chunk({first})", f"cat([{e}, {e}])", f"stack([{e}, {e}])",
        f"{e}.repeat_interleave(2**40)", f"{e}.repeat_interleave(2)", f"pad({e}, 2**62, 2**62)", f"pad({e}, 1, 1)",
        f"{e} @ {e}", f"{e}.T @ {e}", f"matmul({e}, randn(1).expand({last}))",
        f"linear({e}, randn(1, 1).expand(4, {last}))", f"{e}.argmax()", f"{e}.max()", f"isin(randn(4), {e})",
        f"isin({e}, randn(4))", f"{e}.to(dtype=bf16)", f"{e}.eq(0).any()", f"layer_norm({e})", f"rms_norm({e})",
        f"dropout({e}, p=0.5)", f"{e}.masked_fill({e}.gt(0), 0)", f"where({e}.gt(0), {e}, 0)",
        f"embedding(zeros(2, dtype=int64), {e})" if nd == 2 else f"embedding(zeros(1, dtype=int64).expand({h}), randn(4, 4))",
        f"cross_entropy({e}, zeros({first}, dtype=int64))" if nd == 2 else f"{e}.tril()",
        f"{e}[::{str(2**61)}]", f"{e}[::{I64_MAX}]", f"{e}[-{2**61}:]", f"{e}.transpose(0, -1).contiguous()",
        f"{e}.item()",
        f"scaled_dot_product_attention(randn(1, 1, 1, 1).expand(1, 1, {first}, 64), randn(1, 1, 1, 64), randn(1, 1, 1, 64))",
        f"conv2d(randn(1, 1, 1, 1).expand(1, 1, {first}, 4), randn(1, 1, 3, 3))",
        f"max_pool2d(randn(1, 1, 1, 1).expand(1, 1, {first}, 4), 2)",
        f"adaptive_avg_pool2d(randn(1, 1, 1, 1).expand(1, 1, {first}, 4), 2)",
        f"batch_norm(randn(1, 1).expand(2, {first}), none, none, none, none, training=true)",
        f"{e}.unsqueeze(0).expand(2**40, {h}).sum()",
    ]


# --------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------


class Case:
    def __init__(self, kind, label, files, argv, names, shrink=None):
        self.kind = kind          # 'script' | 'mutation' | 'hf'
        self.label = label
        self.files = files        # {relative name: text}
        self.argv = argv          # argv after the binary, relative to the case dir
        self.names = names        # strings whose mention makes an exit-2 message helpful
        self.shrink = shrink      # data for shrinking: ('script', doc, extra) or ('toml', doc, ...)


class Stress:
    def __init__(self, binary, out, seed, count, budget):
        self.binary = str(Path(binary).resolve())
        self.out = Path(out)
        self.seed = seed
        self.count = count
        self.budget = budget
        self.no_targeted = False
        self.skip_slow = False
        self.targeted_only = False
        self.rng = random.Random(seed)
        self.counts = {}
        self.failures = {}  # key -> dict
        self.nfail = 0
        self.exit2 = {}     # normalized message -> (example message, case label, input path)
        self.nruns = 0
        self.t_start = time.monotonic()
        self.run_seconds = 0.0
        self.work = self.out / "work"
        shutil.rmtree(self.out / "fail", ignore_errors=True)
        shutil.rmtree(self.work, ignore_errors=True)
        (self.out / "fail").mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = open(self.out / "runs.jsonl", "w")

    # -- running ------------------------------------------------------------------------------
    def execute(self, case, cwd=None, timeout=TIMEOUT_S):
        cwd = cwd or self.work / "cur"
        shutil.rmtree(cwd, ignore_errors=True)
        cwd.mkdir(parents=True)
        for name, text in case.files.items():
            data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
            (cwd / name).write_bytes(data)
        rc, dt, to, err, outlen = run_gpumem(self.binary, case.argv, cwd, timeout)
        self.run_seconds += dt
        self.nruns += 1
        names = list(case.names) + [n for n in case.files]
        verdict = classify(rc, to, err, names)
        return rc, dt, to, err, outlen, verdict, cwd

    def record(self, case):
        rc, dt, to, err, outlen, verdict, cwd = self.execute(case)
        kind = verdict[1]
        self.counts[(case.kind, verdict[0], kind)] = self.counts.get((case.kind, verdict[0], kind), 0) + 1
        self.log.write(json.dumps({"n": self.nruns, "kind": case.kind, "label": case.label[:300], "rc": rc,
                                   "time": round(dt, 3), "verdict": verdict[:2],
                                   "err": first_error_line(err)[:300] if rc != 0 else ""}, ensure_ascii=False) + "\n")
        if rc == 2:
            line = first_error_line(err)
            key = norm_msg(line)
            if key not in self.exit2:
                saved = self.out / "exit2" / f"{len(self.exit2):04d}"
                saved.mkdir(parents=True, exist_ok=True)
                for name, text in case.files.items():
                    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
                    (saved / name).write_bytes(data[:200_000])
                self.exit2[key] = {"message": line[:600], "label": case.label[:200], "dir": str(saved),
                                   "argv": case.argv, "count": 0}
            self.exit2[key]["count"] += 1
        if verdict[0] == "fail":
            self.on_failure(case, rc, dt, to, err, verdict)
        return verdict

    def dedup_key(self, case, verdict, err):
        if verdict[2]:
            return verdict[2]
        # timeouts and memory: by generator and the shape of the label
        lab = re.sub(r"\d+", "N", case.label)[:100]
        return f"{verdict[1]} {case.kind} {lab}"

    def on_failure(self, case, rc, dt, to, err, verdict):
        key = self.dedup_key(case, verdict, err)
        self.nfail += 1
        d = self.out / "fail" / f"{self.nfail:03d}"
        d.mkdir(parents=True, exist_ok=True)
        for name, text in case.files.items():
            data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
            (d / name).write_bytes(data)
        cmd = "cd " + str(d) + " && NO_COLOR=1 nice -n 19 " + self.binary + " " + " ".join(shq(a) for a in case.argv)
        (d / "command.sh").write_text(cmd + "\n")
        (d / "result.txt").write_text(
            f"label: {case.label}\nkind: {verdict[1]}\nkey: {key}\nexit code: {rc}\ntimed out: {to}\n"
            f"seconds: {dt:.2f}\n\n--- stderr tail ---\n{err[-6000:]}\n")
        ent = self.failures.setdefault(key, {"kind": verdict[1], "count": 0, "dirs": [], "rc": rc, "time": dt,
                                             "stderr": err[-3000:], "label": case.label, "case": case,
                                             "argv": case.argv})
        ent["count"] += 1
        ent["dirs"].append(str(d))
        # keep the smallest input as the representative
        if sum(len(t) for t in case.files.values()) < sum(len(t) for t in ent["case"].files.values()):
            ent.update(case=case, rc=rc, time=dt, stderr=err[-3000:], label=case.label, argv=case.argv)
        print(f"  FAIL #{self.nfail} [{verdict[1]}] {key[:110]} ({case.label[:80]})", flush=True)

    def over_budget(self):
        return time.monotonic() - self.t_start > self.budget

    # -- case makers ----------------------------------------------------------------------------
    def script_case(self, i):
        doc, extra, flavour = gen_script_workload(self.rng, i)
        text = toml_dump(doc, self.rng)
        return Case("script", f"script #{i} ({flavour})", {"w.toml": text}, ["run", "w.toml"] + extra, ["w.toml"],
                    shrink=("script", doc, extra))

    def mutation_case(self, i, fixture):
        label, text, names = mutate_fixture(self.rng, fixture)
        rel = fixture.relative_to(REPO)
        extra = []
        if self.rng.random() < 0.15:
            extra = random_flags(self.rng, False)
        return Case("mutation", f"{rel}: {label}", {"w.toml": text}, ["run", "w.toml"] + extra,
                    ["w.toml"] + sorted(names), shrink=("toml", text, extra))

    def hf_case(self, i, workloads):
        wpath = self.rng.choice(workloads)
        doc = tomllib.loads(wpath.read_text())
        cfg_path = (wpath.parent / doc["model"]["hf_config"]).resolve()
        cfg = json.loads(cfg_path.read_text())
        label = hf_mutation(self.rng, cfg)
        cfg_text = hf_json_text(self.rng, cfg)
        doc["model"]["hf_config"] = "config.json"
        absolutize(doc, wpath.parent)
        rel = wpath.relative_to(REPO)
        if self.rng.random() < 0.2:
            # the bare config, as `gpumem run config.json --batch B --seq S`
            argv = ["run", "config.json", "--batch", str(self.rng.choice([1, 2, 4])), "--seq",
                    str(self.rng.choice([16, 64, 128, 1024]))]
            if self.rng.random() < 0.3:
                argv += ["--mode", self.rng.choice(["train", "inference", "generate"])]
                if argv[-1] == "generate":
                    argv += ["--new-tokens", str(self.rng.choice([1, 4, 16]))]
            if self.rng.random() < 0.2:
                argv += ["--lora-r", str(self.rng.choice([1, 8, 0]))]
            if self.rng.random() < 0.2:
                argv += ["--dtype", "bf16"]
            files = {"config.json": cfg_text}
            lab = f"bare {cfg_path.name}: {label}"
        else:
            files = {"w.toml": toml_dump(doc), "config.json": cfg_text}
            argv = ["run", "w.toml"]
            lab = f"{rel} ({cfg_path.name}): {label}"
        if self.rng.random() < 0.3:
            argv += ["--no-remedies"]
        return Case("hf", lab, files, argv, ["config.json", "w.toml"] + re.findall(r"\w+", label),
                    shrink=("hf", cfg_text, files, argv))

    # -- the plan -----------------------------------------------------------------------------
    def targeted(self):
        cases = targeted_cases(self.rng, self.skip_slow) + targeted_extra()
        for label, doc, extra, files in cases:
            if self.over_budget():
                return
            if files is not None:
                case = Case("targeted", label, files, extra, list(files) + [Path(a).name for a in extra if a.endswith(".toml")],
                            shrink=None)
            else:
                case = Case("targeted", label, {"w.toml": toml_dump(doc)}, ["run", "w.toml"] + extra, ["w.toml"],
                            shrink=("script", doc, extra) if "workload" in doc and "model" not in doc else ("toml", toml_dump(doc), extra))
            self.record(case)
        print(f"  targeted probes: {len(cases)} runs, {self.nfail} failures so far", flush=True)

    def main(self):
        fixtures = fixture_files()
        if not self.no_targeted:
            self.targeted()
        self.count = 0 if self.targeted_only else max(0, self.count - self.nruns)
        hf_workloads = sorted(REPO.glob("fixtures/hf/workloads/*.toml"))
        n_script = int(self.count * 0.5)
        n_hf = int(self.count * 0.15)
        n_mut = self.count - n_script - n_hf
        plan = []
        # every fixture at least twice, the rest at random
        per = max(2, n_mut // max(1, len(fixtures)))
        shuffled = list(fixtures)
        self.rng.shuffle(shuffled)
        for f in shuffled:
            plan += [("mutation", f)] * per
        plan = plan[:n_mut] if len(plan) > n_mut else plan + [("mutation", self.rng.choice(fixtures)) for _ in range(n_mut - len(plan))]
        plan += [("script", None)] * n_script + [("hf", None)] * n_hf
        self.rng.shuffle(plan)
        print(f"stress: {len(plan)} runs planned ({n_script} scripts, {n_mut} fixture mutations over "
              f"{len(fixtures)} fixtures, {n_hf} hf config mutations), budget {self.budget:.0f} s", flush=True)
        for i, (kind, f) in enumerate(plan):
            if self.over_budget():
                print(f"stress: time budget reached after {i} runs", flush=True)
                break
            if kind == "script":
                case = self.script_case(i)
            elif kind == "mutation":
                case = self.mutation_case(i, f)
            else:
                case = self.hf_case(i, hf_workloads)
            self.record(case)
            if (i + 1) % 100 == 0:
                el = time.monotonic() - self.t_start
                print(f"  {i + 1} runs, {self.nfail} failures ({len(self.failures)} distinct), {el:.0f} s", flush=True)
        self.shrink_all()
        self.report()

    # -- shrinking ------------------------------------------------------------------------------
    def still_fails(self, case, key, timeout):
        rc, dt, to, err, outlen, verdict, cwd = self.execute(case, self.work / "shrink", timeout)
        if verdict[0] != "fail":
            return False, None
        k = self.dedup_key(case, verdict, err)
        return (k == key or (verdict[2] is None and verdict[1] == self.failures[key]["kind"])), (rc, dt, err)

    def shrink_all(self):
        deadline = time.monotonic() + max(60.0, min(300.0, self.budget * 0.25))
        for key, ent in self.failures.items():
            if time.monotonic() > deadline:
                break
            if ent["time"] > 8 or ent["kind"] == "timeout":
                ent["shrunk"] = None  # too slow to shrink by rerunning; cut by hand
                continue
            try:
                self.shrink_one(key, ent, deadline)
            except Exception as e:  # shrinking is best effort
                ent["shrink_error"] = repr(e)

    def shrink_one(self, key, ent, deadline):
        case = ent["case"]
        sh = case.shrink
        if sh is None:
            return
        tries = [0]

        def test(c):
            if tries[0] >= 150 or time.monotonic() > deadline:
                return False
            tries[0] += 1
            ok, info = self.still_fails(c, key, min(TIMEOUT_S, max(5, ent["time"] * 3 + 2)))
            return ok

        if sh[0] == "script":
            doc, extra = copy.deepcopy(sh[1]), list(sh[2])

            def mk(d, ex):
                return Case("script", case.label, {"w.toml": toml_dump(d)}, ["run", "w.toml"] + ex, case.names,
                            ("script", d, ex))

            # flags first
            for j in range(len(extra) - 1, -1, -1):
                if not extra[j].startswith("--"):
                    continue
                k = j + 1
                while k < len(extra) and not extra[k].startswith("--"):
                    k += 1
                cand = extra[:j] + extra[k:]
                if test(mk(doc, cand)):
                    extra = cand
            wl = doc["workload"]
            for k in ["capacity", "alloc_conf", "iterations", "name", "device"]:
                if k in wl:
                    d2 = copy.deepcopy(doc)
                    del d2["workload"][k]
                    if test(mk(d2, extra)):
                        doc = d2
            if "params" in doc:
                d2 = copy.deepcopy(doc)
                del d2["params"]
                if test(mk(d2, extra)):
                    doc = d2
            # move setup into body, then cut lines
            wl = doc["workload"]
            if isinstance(wl.get("setup"), str):
                d2 = copy.deepcopy(doc)
                s = d2["workload"].pop("setup")
                d2["workload"]["body"] = s + "\n" + d2["workload"].get("body", "")
                if test(mk(d2, extra)):
                    doc = d2
                else:
                    d2 = copy.deepcopy(doc)
                    del d2["workload"]["setup"]
                    if test(mk(d2, extra)):
                        doc = d2
            for field in ("setup", "body"):
                if not isinstance(doc["workload"].get(field), str):
                    continue
                lines = doc["workload"][field].split("\n")

                def mkl(ls, field=field):
                    d2 = copy.deepcopy(doc)
                    d2["workload"][field] = "\n".join(ls)
                    return mk(d2, extra)

                lines = ddmin(lines, lambda ls: test(mkl(ls)))
                doc["workload"][field] = "\n".join(lines)
                # long lines: shorten repeated runs
            final = mk(doc, extra)
        elif sh[0] == "toml":
            text, extra = sh[1], list(sh[2])
            try:
                doc = tomllib.loads(text)
            except Exception:
                doc = None

            def mkt(t, ex):
                return Case("mutation", case.label, {"w.toml": t}, ["run", "w.toml"] + ex, case.names, None)

            for j in range(len(extra) - 1, -1, -1):
                if not extra[j].startswith("--"):
                    continue
                k = j + 1
                while k < len(extra) and not extra[k].startswith("--"):
                    k += 1
                cand = extra[:j] + extra[k:]
                if test(mkt(text, cand)):
                    extra = cand
            if doc is not None:
                for path in [p for p, _ in flatten(doc)]:
                    d2 = copy.deepcopy(doc)
                    try:
                        del_path(d2, path)
                    except KeyError:
                        continue
                    if test(mkt(toml_dump(d2), extra)):
                        doc = d2
                for field in ("setup", "body"):
                    v = doc.get("workload", {}).get(field)
                    if isinstance(v, str):
                        def mkl(ls, field=field):
                            d2 = copy.deepcopy(doc)
                            d2["workload"][field] = "\n".join(ls)
                            return mkt(toml_dump(d2), extra)

                        lines = ddmin(v.split("\n"), lambda ls: test(mkl(ls)))
                        doc["workload"][field] = "\n".join(lines)
                text = toml_dump(doc)
            final = mkt(text, extra)
        elif sh[0] == "hf":
            cfg_text, files, argv = sh[1], dict(sh[2]), list(sh[3])
            try:
                cfg = json.loads(cfg_text)
            except Exception:
                cfg = None
            if isinstance(cfg, dict):
                for k in list(cfg):
                    c2 = dict(cfg)
                    del c2[k]
                    f2 = dict(files)
                    f2["config.json"] = json.dumps(c2, indent=1)
                    if test(Case("hf", case.label, f2, argv, case.names)):
                        cfg = c2
                files["config.json"] = json.dumps(cfg, indent=1)
            final = Case("hf", case.label, files, argv, case.names)
        else:
            return
        ok, info = self.still_fails(final, key, TIMEOUT_S)
        if ok:
            d = self.out / "fail" / ("min_" + re.sub(r"\W+", "_", key)[:60])
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            for name, t in final.files.items():
                (d / name).write_bytes(t.encode("utf-8", "surrogatepass") if isinstance(t, str) else t)
            cmd = "cd " + str(d) + " && NO_COLOR=1 nice -n 19 " + self.binary + " " + " ".join(shq(a) for a in final.argv)
            (d / "command.sh").write_text(cmd + "\n")
            rc, dt, err = info
            (d / "result.txt").write_text(f"key: {key}\nexit code: {rc}\nseconds: {dt:.2f}\n\n{err[-6000:]}\n")
            ent["shrunk"] = {"dir": str(d), "files": {k: (v if len(v) < 4000 else v[:4000] + "…") for k, v in final.files.items()},
                             "argv": final.argv, "rc": rc, "stderr": err[-2500:], "tries": tries[0]}

    # -- reporting ------------------------------------------------------------------------------
    def report(self):
        wall = time.monotonic() - self.t_start
        by_kind = {}
        for (ck, v, k), n in sorted(self.counts.items()):
            by_kind.setdefault(ck, {})[f"{v}:{k}"] = n
        summary = {
            "seed": self.seed, "runs": self.nruns, "wall_seconds": round(wall, 1),
            "gpumem_seconds": round(self.run_seconds, 1), "counts": by_kind, "failures": self.nfail,
            "distinct_failures": [
                {"key": k, "kind": e["kind"], "count": e["count"], "rc": e["rc"], "example": e["dirs"][0],
                 "label": e["label"], "argv": e["argv"], "stderr": e["stderr"][-1500:],
                 "shrunk": e.get("shrunk")}
                for k, e in self.failures.items()
            ],
        }
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False))
        with open(self.out / "exit2_messages.txt", "w") as f:
            for k, v in sorted(self.exit2.items(), key=lambda kv: -kv[1]["count"]):
                f.write(f"[{v['count']}x] {v['message']}\n    input: {v['dir']} ({v['label']}) argv {' '.join(v['argv'])}\n")
        print(f"\nstress: {self.nruns} runs in {wall:.0f} s ({self.run_seconds:.0f} s in gpumem)")
        for ck, d in by_kind.items():
            print(f"  {ck}: " + ", ".join(f"{k} {n}" for k, n in d.items()))
        print(f"  {self.nfail} failures, {len(self.failures)} distinct; {len(self.exit2)} distinct exit-2 messages")
        for k, e in self.failures.items():
            print(f"  - [{e['kind']}] x{e['count']} {k[:150]}\n      e.g. {e['dirs'][0]} ({e['label'][:100]})")
            if e.get("shrunk"):
                print(f"      shrunk: {e['shrunk']['dir']}")


def ddmin(items, test):
    """Delta debugging: a smaller list for which test still holds (test(items) assumed true)."""
    n = 2
    while len(items) >= 2:
        chunk = max(1, len(items) // n)
        reduced = False
        for start in range(0, len(items), chunk):
            cand = items[:start] + items[start + chunk:]
            if cand and test(cand):
                items = cand
                n = max(n - 1, 2)
                reduced = True
                break
        if not reduced:
            if n >= len(items):
                break
            n = min(len(items), n * 2)
    return items


def shq(a):
    return a if re.match(r"^[\w./=,:+-]+$", a) else "'" + a.replace("'", "'\\''") + "'"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=1500)
    ap.add_argument("--out", default="/tmp/stress")
    ap.add_argument("--budget", type=float, default=1200, help="seconds of runs before stopping (default 1200)")
    ap.add_argument("--no-targeted", action="store_true", help="only the random cases, not the fixed probes")
    ap.add_argument("--targeted-only", action="store_true", help="only the fixed probes")
    ap.add_argument("--skip-slow", action="store_true", help="leave out the probes of the count bounds and loops (20 s each)")
    a = ap.parse_args()
    st = Stress(a.binary, a.out, a.seed, a.count, a.budget)
    st.no_targeted = a.no_targeted
    st.targeted_only = a.targeted_only
    st.skip_slow = a.skip_slow
    st.main()


if __name__ == "__main__":
    main()
