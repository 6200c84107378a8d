#!/usr/bin/env python3
"""Writes fixtures/bad/corpus/: bad, hostile and mistaken inputs of every kind gpumem reads, and
manifest.json, which says for each case what gpumem SHOULD do with it (issue 16).

Kinds (the prefix of each case's name): `w_` workload TOML and scripts, `hf_` Hugging Face
config.json, `s_` snapshots (PyTorch pickle and JSON, gpumem JSON), `t_` allocator traces for
`gpumem replay`, `b_` baselines for `gpumem check`, `f_` flags, sizes, counts, --alloc-conf,
--param and environment variables.

A manifest case is {"name", "args" (argv after `gpumem`, paths relative to the repository root),
"env" (optional), "exit" (2: refused as bad input; 1: a finding asked for with --fail-on; 0:
PyTorch accepts it too), "stderr_contains" (what the message must name: the file, the key, the
flag or "line N"), "why"}. "$TMP" in args and env stands for a scratch directory the runner makes.

Usage:
  python3 scripts/make_bad_corpus.py              write the corpus and the manifest (deterministic)
  python3 scripts/make_bad_corpus.py --check BIN  also run every case with BIN from the repository
                                                  root and list those whose behaviour differs

Standard library only; the same files byte for byte on every run.
"""
import hashlib
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
REL = "fixtures/bad/corpus"
OUT = os.path.join(ROOT, REL)
MIB = 1 << 20
BASE = 0x7F0000000000

CASES = []
FILES = {}


def garbage(n, seed):
    """n deterministic pseudo-random bytes."""
    out = b""
    h = hashlib.sha256(seed.encode()).digest()
    while len(out) < n:
        out += h
        h = hashlib.sha256(h).digest()
    return out[:n]


def line_of(text, needle):
    """"line N" of the first line of text holding needle."""
    return "line %d" % (text[: text.index(needle)].count("\n") + 1)


def put(name, data):
    """Records a corpus file; returns its path from the repository root."""
    assert name not in FILES, name
    if isinstance(data, str):
        data = data.encode("utf-8")
    assert len(data) < 200_000, (name, len(data))
    FILES[name] = data
    return f"{REL}/{name}"


def putdir(name, inner=None):
    """A directory where a file is expected (holding a README, since git keeps no empty one)."""
    FILES[f"{name}/README"] = (inner or "A directory given where a file is expected.\n").encode()
    return f"{REL}/{name}"


# Traces that contradict themselves are read with a warning naming the entry, not refused.
WARNED = {
    "s_trace_double_free": "device_traces[0][6]: free at",
    "s_trace_double_free_pickle": "device_traces[0][6]: free at",
    "s_trace_free_size_mismatch": "device_traces[0][4]: free of 4096 bytes",
    "s_trace_segment_free_busy": "device_traces[0][6]: the segment at",
    "s_trace_alloc_twice": "device_traces[0][3]: alloc at",
    "s_replay_double_free": "device_traces[0][6]: free at",
}

# Cases whose message names the problem in other words than the ones first asked for.
REWORDED = {
    "hf_bert_generate": "generation (bert is an encoder) is not modelled",
}

# Cases gpumem does not yet handle as the manifest says (the test skips and lists them).
PENDING: dict = {}


def case(name, args, contains, why, exit=2, env=None):
    assert all(c["name"] != name for c in CASES), name
    c = {"name": name, "args": list(args)}
    if env:
        c["env"] = env
    c["exit"] = exit
    c["stderr_contains"] = contains
    c["why"] = why
    CASES.append(c)


# ----------------------------------------------------------------------------------------------
# workloads: TOML and the line language
# ----------------------------------------------------------------------------------------------

def script(body, setup=None, extra="", name="t"):
    text = f'[workload]\nname = "{name}"\n{extra}'
    if setup is not None:
        text += f'setup = """\n{setup}\n"""\n'
    text += f'body = """\n{body}\n"""\n'
    return text


OK_TOML = script("x = randn(4, 4, requires_grad=true)\nloss = (x * x).sum()\nloss.backward()")
MLP_PRESET = """[workload]
name = "p"

[model]
kind = "mlp"
d_in = 16
hidden = 32
layers = 2
d_out = 8

[train]
batch = 4
optimizer = "adam"
"""
GPT_PRESET = """[workload]
name = "g"

[model]
kind = "gpt"
vocab = 128
seq = 16
d_model = 64
heads = 4
layers = 2
attention = "sdpa"

[train]
batch = 2
optimizer = "adamw"
"""


def workloads():
    ok = put("_ok_tiny.toml", OK_TOML)

    def run(name, text, contains, why, exit=2, extra_args=()):
        p = put(f"{name}.toml", text)
        case(name, ["run", p, *extra_args], contains, why, exit)

    # the file itself
    run("w_empty", "", "w_empty.toml", "an empty file: no [workload] table")
    run("w_whitespace_only", "\n\n   \n\t\n", "w_whitespace_only.toml", "only blank lines")
    case("w_nonexistent", ["run", f"{REL}/no_such_workload.toml"], "no_such_workload.toml",
         "a path that does not exist")
    case("w_directory", ["run", putdir("w_dir.toml")], "w_dir.toml",
         "a directory named like a workload, holding no config.json")
    run("w_binary_garbage", garbage(3000, "w_garbage"), "w_binary_garbage.toml",
        "random bytes saved as .toml")
    run("w_non_utf8", b'[workload]\nname = "caf\xe9"\nbody = "x = randn(4)"\n', "line 2",
        "a Latin-1 byte in a string: TOML must be UTF-8")
    run("w_nul_byte", b'[workload]\nname = "t"\nbody = "x = randn(4)\x00"\n', "line 3",
        "a NUL byte inside a string")
    run("w_bom_ok", "\ufeff" + OK_TOML, "", "a UTF-8 BOM (Notepad) before a valid workload: accepted",
        exit=0)
    run("w_crlf_ok", OK_TOML.replace("\n", "\r\n"), "",
        "Windows line endings in a valid workload: accepted", exit=0)
    run("w_crlf_error_line",
        script("x = randn(4, 4)\ny = x.sin()\nz = frobnicate(y)").replace("\n", "\r\n"),
        "line 6", "Windows line endings: the unknown function is still reported on line 6")
    run("w_toml_unterminated_string", '[workload]\nname = "t\nbody = "x = randn(4)"\n', "line 2",
        "a string that never closes")
    run("w_truncated", OK_TOML[: OK_TOML.index("loss =") + 9], "w_truncated.toml",
        'cut off inside the body\'s """ string')
    run("w_duplicate_key", '[workload]\nname = "a"\nname = "b"\nbody = "x = randn(4)"\n', "line 3",
        "a key given twice")
    run("w_deep_toml_array", '[workload]\nname = "t"\nbody = "x = randn(4)"\ndeep = '
        + "[" * 5000 + "]" * 5000 + "\n", "line 4", "an array nested 5,000 deep (stack overflow bait)")

    # keys
    run("w_typo_key", '[workload]\nname = "t"\niteratons = 3\nbody = "x = randn(4)"\n', "iteratons",
        "'iterations' misspelt")
    run("w_typo_table", '[workloads]\nname = "t"\nbody = "x = randn(4)"\n', "workloads",
        "[workloads] instead of [workload]")
    run("w_key_outside_table", 'iterations = 3\n[workload]\nname = "t"\nbody = "x = randn(4)"\n',
        "'iterations'", "a [workload] key written above the table")
    run("w_missing_name", '[workload]\nbody = "x = randn(4)"\n', "'name'", "no name")
    run("w_empty_name", '[workload]\nname = ""\nbody = "x = randn(4)"\n', "'name'", "an empty name")
    run("w_name_not_string", '[workload]\nname = 7\nbody = "x = randn(4)"\n', "'name'", "name is a number")
    run("w_no_statements", '[workload]\nname = "t"\nsetup = ""\nbody = "# nothing"\n', "body",
        "neither setup nor body holds a statement")
    run("w_body_is_array", '[workload]\nname = "t"\nbody = ["x = randn(4)"]\n', "'body'",
        "body as a list of lines instead of a string")
    run("w_iterations_string", '[workload]\nname = "t"\niterations = "3"\nbody = "x = randn(4)"\n',
        "'iterations'", "iterations as a string")
    run("w_iterations_zero", '[workload]\nname = "t"\niterations = 0\nbody = "x = randn(4)"\n',
        "'iterations'", "zero iterations")
    run("w_iterations_negative", '[workload]\nname = "t"\niterations = -1\nbody = "x = randn(4)"\n',
        "'iterations'", "negative iterations")
    run("w_iterations_float", '[workload]\nname = "t"\niterations = 2.5\nbody = "x = randn(4)"\n',
        "'iterations'", "fractional iterations")
    run("w_iterations_huge",
        '[workload]\nname = "t"\niterations = 9223372036854775807\nbody = "x = randn(4)"\n',
        "'iterations'", "i64::MAX iterations")
    run("w_capacity_typo_unit", '[workload]\nname = "t"\ncapacity = "24GiBs"\nbody = "x = randn(4)"\n',
        "'capacity'", "an unknown unit")
    run("w_capacity_negative", '[workload]\nname = "t"\ncapacity = "-1GiB"\nbody = "x = randn(4)"\n',
        "'capacity'", "a negative capacity")
    run("w_capacity_zero", '[workload]\nname = "t"\ncapacity = 0\nbody = "x = randn(4)"\n',
        "'capacity'", "a device of 0 bytes")
    run("w_capacity_float_bytes",
        '[workload]\nname = "t"\ncapacity = 1.5e10\nbody = "x = randn(4)"\n', "'capacity'",
        "capacity as a float number of bytes")
    run("w_alloc_conf_typo",
        '[workload]\nname = "t"\nalloc_conf = "expandable_segment:True"\nbody = "x = randn(4)"\n',
        "expandable_segment", "PyTorch: Unrecognized key 'expandable_segment' in CUDA allocator config")
    run("w_device_tpu", '[workload]\nname = "t"\ndevice = "tpu"\nbody = "x = randn(4)"\n', "'tpu'",
        "a device gpumem does not have")
    run("w_params_string", script("x = randn(batch, 4)", extra="") + '[params]\nbatch = "8"\n',
        "batch", "a [params] value that is a string")
    run("w_params_float", script("x = randn(batch, 4)") + "[params]\nbatch = 8.5\n", "batch",
        "a fractional parameter")
    run("w_check_bad_tolerance", OK_TOML + '[check]\ntolerance = "two percent"\n', "'tolerance'",
        "a tolerance that is not a percentage")
    run("w_check_unknown_key", OK_TOML + '[check]\ntolerence = "2%"\n', "tolerence",
        "a misspelt [check] key")

    # found by scripts/stress_workloads.py (issue 16): each was a panic, a hang or an abort
    run("w_reduce_dim_past_i8", script("x = randn(2, 3)\ny = x.sum(dim=128)"),
        "Dimension out of range", "a reduction dim of 128 (stored as i8: a panic)")
    run("w_argmax_dim_very_negative", script("x = randn(2, 3)\ny = x.argmax(dim=-129)"),
        "Dimension out of range", "argmax over dim -129")
    run("w_squeeze_dim_out_of_range", script("x = randn(2, 3)\ny = x.squeeze(dim=128)"),
        "Dimension out of range", "squeeze(dim=128) on a 2-d tensor (was read as dim 0)")
    run("w_flatten_dim_out_of_range", script("x = randn(2, 3)\ny = x.flatten(128, 0)"),
        "Dimension out of range", "flatten(128, 0) on a 2-d tensor (was read as dims 0, 0)")
    run("w_split_of_huge_view", script("e = randn(1).expand(2**40)\ny = e.split(1)"),
        "at most 100000", "a trillion pieces of an expanded view (4 GB before the abort)")
    run("w_chunk_of_huge_view", script("e = randn(1).expand(2**40)\ny = e.chunk(2**40)"),
        "at most 100000", "a trillion chunks")
    run("w_nested_loops_bounded",
        script("x = randn(4)\nfor i in range(1000000) {\n  for j in range(1000000) {\n  }\n}"),
        "100,000,000 statements", "10^12 loop passes: days of work")
    run("w_graph_grows_bounded",
        script("x = randn(4, requires_grad=true)\nfor i in range(1000000) {\n"
               "  for j in range(1000000) {\n    x = x * 1.0001\n  }\n}"),
        "tensors and autograd nodes", "an autograd graph growing without end (an abort at 4 GB)")
    run("w_expandable_huge_segment",
        script("x = randn(2, 2)\ny = x @ x",
               extra='alloc_conf = "expandable_segments:True,large_segment_size_mb:17592186044415"\n'),
        "large_segment_size_mb", "a segment size whose bytes overflow u64 (the run never ended)")
    run("w_cpu_sum_of_huge_view",
        script("e = randn(1).expand(2**31)\ny = e.sum()", extra='device = "cpu"\n'),
        "float64 copies", "a 16 GiB working copy of a view of one element (an abort)")
    run("w_preset_micro_batches_multiply",
        MLP_PRESET.replace("[train]\n", "[train]\niterations = 10000\ngrad_accum = 1024\n", 1),
        "micro-batches", "10,000 iterations of 1,024 micro-batches: each bounded, the product not")
    run("w_nan_is_a_number_ok", script("x = full([], fill_value=nan)\ny = x + 1"), "",
        "nan is a number, as inf is", exit=0)

    # presets
    run("w_preset_unknown_kind", MLP_PRESET.replace('"mlp"', '"transformer"'), "transformer",
        "an unknown model kind")
    run("w_preset_missing_hidden", MLP_PRESET.replace("hidden = 32\n", ""), "'hidden'",
        "an MLP without its hidden width")
    run("w_preset_typo_optimizer", MLP_PRESET.replace('"adam"', '"adamm"'), "adamm",
        "an unknown optimizer")
    run("w_preset_negative_batch", MLP_PRESET.replace("batch = 4", "batch = -4"), "'batch'",
        "a negative batch")
    run("w_preset_zero_layers", MLP_PRESET.replace("layers = 2", "layers = 0"), "'layers'",
        "an MLP of no layers")
    run("w_preset_bad_precision", MLP_PRESET + 'precision = "fp8"\n', "fp8",
        "a precision gpumem does not model")
    run("w_preset_heads_not_dividing", GPT_PRESET.replace("heads = 4", "heads = 3"), "line 9",
        "PyTorch: embed_dim must be divisible by num_heads")
    run("w_preset_bad_attention", GPT_PRESET.replace('"sdpa"', '"flash3"'), "flash3",
        "an unknown attention kind")
    run("w_preset_and_script", MLP_PRESET.replace('name = "p"\n', 'name = "p"\nbody = "x = randn(4)"\n'),
        "body", "a [model] preset and a script body at once")
    run("w_hf_config_missing", '[workload]\nname = "h"\n[model]\nhf_config = "no_such_config.json"\n'
        "[train]\nbatch = 1\nseq = 8\n", "no_such_config.json", "[model] hf_config names a missing file")
    run("w_torchvision_unknown", '[workload]\nname = "v"\n[model]\ntorchvision = "resnet9000"\n'
        "[train]\nbatch = 1\n", "resnet9000", "a torchvision model that does not exist")

    # the line language: syntax
    def body(name, text, contains, why, setup=None, exit=2):
        run(name, script(text, setup=setup), contains, why, exit=exit)

    body("w_unbalanced_paren", "x = randn(4, 4)\ny = relu(x", "opened at 5:9",
         "a call that never closes its parenthesis (the script ends inside it)")
    body("w_unbalanced_bracket", "x = randn(4, 4)\ny = cat([x, x, dim=0)", "line 5",
         "a list closed by ')' instead of ']'")
    body("w_extra_close_paren", "x = randn(4, 4))", "line 4", "one ')' too many")
    body("w_block_never_closed", "no_grad {\n  x = randn(4)\n", "line 4",
         "a no_grad block without its closing '}'")
    body("w_stray_close_brace", "x = randn(4)\n}", "line 5", "a '}' that closes nothing")
    body("w_deep_parens", "x = " + "(" * 3000 + "1" + ")" * 3000, "line 4",
         "parentheses nested 3,000 deep (stack overflow bait)")
    body("w_deep_blocks", "no_grad {\n" * 2000 + "x = randn(4)\n" + "}\n" * 2000, "line",
         "2,000 nested blocks (stack overflow bait)")
    body("w_bad_string_escape", 'x = randn(4)\nmark("a\\\\q")', "line 5",
         "an escape the line language does not have")
    body("w_assign_to_reserved", "true = randn(4)", "line 4", "assigning to a reserved word")
    body("w_positional_after_keyword", "x = randn(dtype=f32, 4)", "line 4",
         "a positional argument after a keyword one")
    body("w_repeated_keyword", "x = randn(4, dtype=f32, dtype=bf16)", "line 4",
         "a keyword argument given twice")
    body("w_assign_to_call", "relu(x) = randn(4)", "line 4", "an assignment whose target is a call")

    # the line language: names, functions, arity
    body("w_unknown_function", "x = randn(4, 4)\ny = frobnicate(x)", "frobnicate",
         "a function the engine does not have")
    body("w_unknown_method", "x = randn(4, 4)\ny = x.frobnicate()", "frobnicate",
         "a method the engine does not have")
    body("w_undefined_name", "y = x + 1", "line 4", "a name never assigned")
    body("w_use_after_del", "x = randn(4)\ndel x\ny = x.sin()", "line 6", "using a deleted name")
    body("w_del_undefined", "del z", "line 4", "del of a name never assigned")
    body("w_matmul_missing_arg", "x = randn(4, 4)\ny = matmul(x)", "line 5",
         "matmul with one argument")
    body("w_relu_too_many_args", "x = randn(4, 4)\ny = relu(x, x)", "line 5",
         "relu with two arguments")
    body("w_unknown_keyword", "x = randn(4, requires_gard=true)", "requires_gard",
         "a misspelt keyword argument")
    body("w_bad_dtype", "x = randn(4, dtype=float128)", "float128", "a dtype PyTorch does not have")
    body("w_unpack_count", "x = randn(6, 4)\na, b = x.split(2, 0)", "line 5",
         "three pieces unpacked into two names")
    body("w_mark_not_string", "x = randn(4)\nmark(3)", "line 5", "mark() of a number")

    # the line language: what PyTorch refuses when it runs
    body("w_randn_no_args", "x = randn()\nkeep(x)", "line 4",
         "PyTorch: randn() received an invalid combination of arguments - got ()")
    body("w_negative_size", "x = randn(-4, 4)", "line 4",
         "PyTorch: Trying to create tensor with negative dimension -4")
    body("w_size_overflow", "x = randn(2**62, 4)", "line 4",
         "PyTorch: Storage size calculation overflowed")
    body("w_float_size", "x = randn(2.5, 4)", "line 4", "PyTorch: a float where a size is expected")
    body("w_matmul_shape_mismatch", "a = randn(4, 5)\nb = randn(6, 7)\nc = a @ b", "line 6",
         "PyTorch: mat1 and mat2 shapes cannot be multiplied (4x5 and 6x7)")
    body("w_linear_shape_mismatch", "x = randn(8, 16)\nw = randn(32, 15)\ny = linear(x, w)", "line 6",
         "PyTorch: mat1 and mat2 shapes cannot be multiplied (8x16 and 15x32)")
    body("w_broadcast_mismatch", "a = randn(3, 4)\nb = randn(5)\nc = a + b", "line 6",
         "PyTorch: The size of tensor a (4) must match the size of tensor b (5)")
    body("w_view_bad_shape", "x = randn(4, 4)\ny = x.view(3, 5)", "line 5",
         "PyTorch: shape '[3, 5]' is invalid for input of size 16")
    body("w_transpose_out_of_range", "x = randn(4, 4)\ny = x.transpose(0, 5)", "line 5",
         "PyTorch: Dimension out of range")
    body("w_cat_mismatch", "a = randn(2, 3)\nb = randn(2, 4)\nc = cat([a, b], dim=0)", "line 6",
         "PyTorch: Sizes of tensors must match except in dimension 0")
    body("w_backward_non_scalar", "x = randn(4, 4, requires_grad=true)\ny = x * 2\ny.backward()",
         "line 6", "PyTorch: grad can be implicitly created only for scalar outputs")
    body("w_backward_no_grad", "x = randn(4, 4)\nloss = (x * x).sum()\nloss.backward()", "line 6",
         "PyTorch: element 0 of tensors does not require grad and does not have a grad_fn")
    body("w_backward_twice",
         "x = randn(4, 4, requires_grad=true)\nloss = x.sin().sum()\nloss.backward()\nloss.backward()",
         "line 7", "PyTorch: Trying to backward through the graph a second time")
    body("w_optimizer_non_leaf", "x = randn(4, 4, requires_grad=true)\ny = x * 2\nopt = adam([y])",
         "line 6", "PyTorch: can't optimize a non-leaf Tensor")
    body("w_optimizer_empty", "opt = sgd([])", "line 4",
         "PyTorch: optimizer got an empty parameter list")
    body("w_requires_grad_int", "x = zeros(4, dtype=int64, requires_grad=true)", "line 4",
         "PyTorch: Only Tensors of floating point and complex dtype can require gradients")
    body("w_inplace_on_leaf", "x = randn(4, requires_grad=true)\nx.add_(1)", "line 5",
         "PyTorch: a leaf Variable that requires grad is being used in an in-place operation")
    body("w_item_of_many", "x = randn(4)\nv = x.item()", "line 5",
         "PyTorch: a Tensor with 4 elements cannot be converted to Scalar")
    body("w_layer_norm_weight_mismatch", "x = randn(4, 8)\nw = randn(7)\ny = layer_norm(x, w)", "line 6",
         "PyTorch: Given normalized_shape=[7], expected input with shape [*, 7], but got input of "
         "size[4, 8]")
    body("w_layer_norm_shape_list", "x = randn(4, 8)\ny = layer_norm(x, [7])", "line 5",
         "F.layer_norm(x, [7]) on a last dimension of 8")
    body("w_sdpa_head_dim_mismatch",
         "q = randn(2, 4, 16, 64)\nk = randn(2, 4, 16, 32)\nv = randn(2, 4, 16, 64)\n"
         "a = scaled_dot_product_attention(q, k, v)", "line 7",
         "PyTorch: query and key head dims differ (64 and 32)")
    body("w_sdpa_seq_mismatch",
         "q = randn(2, 4, 16, 64)\nk = randn(2, 4, 16, 64)\nv = randn(2, 4, 12, 64)\n"
         "a = scaled_dot_product_attention(q, k, v, is_causal=false)", "line 7",
         "PyTorch: key and value sequence lengths differ (16 and 12)")
    body("w_cross_entropy_float_target", "x = randn(8, 10)\ny = randn(8, 10, 3)\nl = cross_entropy(x, y)",
         "line 6", "PyTorch: a float target of the wrong shape")
    body("w_embedding_float_indices", "w = randn(10, 4)\ni = randn(3)\ne = embedding(i, w)", "line 6",
         "PyTorch: Expected tensor for argument #1 'indices' to have scalar type Long")
    body("w_softmax_dim_out_of_range", "x = randn(4, 4)\ny = softmax(x, 3)", "line 5",
         "PyTorch: Dimension out of range (expected to be in range of [-2, 1], but got 3)")
    body("w_conv2d_channels",
         "x = randn(1, 3, 8, 8)\nw = randn(16, 4, 3, 3)\ny = conv2d(x, w)", "line 6",
         "PyTorch: expected input to have 4 channels, but got 3 channels")
    body("w_step_on_tensor", "x = randn(4)\nx.step()", "line 5", "opt.step() called on a tensor")
    return ok


# ----------------------------------------------------------------------------------------------
# Hugging Face config.json
# ----------------------------------------------------------------------------------------------

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
         "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
         "num_hidden_layers": 2, "vocab_size": 128, "max_position_embeddings": 256,
         "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_head": 4,
        "n_layer": 2, "n_positions": 32, "vocab_size": 128}


def hf():
    def run(name, data, contains, why, exit=2, args=("--batch", "1", "--seq", "8"), fname=None):
        if not isinstance(data, (bytes, str)):
            data = json.dumps(data, indent=2)
        p = put(fname or f"{name}.config.json", data)
        case(name, ["run", p, *args], contains, why, exit)

    def llama(**kv):
        d = dict(LLAMA)
        for k, v in kv.items():
            if v is None:
                d.pop(k)
            else:
                d[k] = v
        return d

    run("hf_empty", "", "hf_empty.config.json", "an empty config.json")
    run("hf_truncated", json.dumps(LLAMA, indent=2)[:150], "hf_truncated.config.json",
        "a config cut off mid-way")
    run("hf_not_object", "[1, 2, 3]\n", "hf_not_object.config.json", "a JSON list, not an object")
    run("hf_binary_garbage", garbage(2048, "hf"), "hf_binary_garbage.config.json", "random bytes")
    run("hf_missing_model_type", llama(model_type=None, architectures=None), "'model_type'",
        "no model_type: transformers cannot pick a class")
    run("hf_unknown_model_type", llama(model_type="mamba9"), "mamba9",
        "transformers: Unrecognized model ... model_type mamba9")
    run("hf_hidden_size_string", llama(hidden_size="64"), "'hidden_size'", "hidden_size as a string")
    run("hf_layers_negative", llama(num_hidden_layers=-2), "num_hidden_layers", "negative layers")
    run("hf_layers_float", llama(num_hidden_layers=2.5), "num_hidden_layers", "fractional layers")
    run("hf_layers_huge", llama(num_hidden_layers=100_000_000), "num_hidden_layers",
        "a hundred million layers")
    run("hf_layers_past_bound", llama(num_hidden_layers=1001), "at most 1,000",
        "1,001 layers: 380 KB of host memory each")
    located = json.dumps(llama(vocab_size=-1), indent=2)
    at = line_of(located, '"vocab_size"')
    run("hf_vocab_negative_located", located,
        f"hf_vocab_negative_located.config.json: {at}: 'vocab_size'",
        "a bad key of a bare config is located at its line in the config, not in the generated "
        "workload")
    run("hf_heads_not_dividing", llama(num_attention_heads=5, num_key_value_heads=5),
        "num_attention_heads", "hidden_size 64 is not a multiple of 5 heads")
    run("hf_kv_heads_not_dividing", llama(num_key_value_heads=3), "num_key_value_heads",
        "4 query heads cannot be grouped over 3 key/value heads")
    run("hf_vocab_zero", llama(vocab_size=0), "vocab_size", "an empty vocabulary")
    run("hf_nan_eps", json.dumps(LLAMA, indent=2).replace("1e-06", "NaN"),
        line_of(json.dumps(LLAMA, indent=2), "rms_norm_eps"),
        "NaN (Python's json writes it; JSON has no NaN)")
    run("hf_trailing_comma", json.dumps(LLAMA, indent=2)[:-2] + ",\n}\n", "line",
        "a trailing comma (json.load refuses it too)")
    run("hf_non_utf8", json.dumps(llama(model_type="llama"), indent=2)
        .replace('"LlamaForCausalLM"', '"Llama\u00e9"').encode("utf-8").replace(b"\xc3\xa9", b"\xe9"),
        "hf_non_utf8.config.json", "a Latin-1 byte inside a string")
    run("hf_bom", "\ufeff" + json.dumps(LLAMA, indent=2), "hf_bom.config.json",
        "a UTF-8 BOM: transformers' json.loads raises 'Unexpected UTF-8 BOM'")
    run("hf_gpt2_seq_past_positions", GPT2, "n_positions",
        "GPT-2 has 32 learned positions; 64 tokens index past them (IndexError in PyTorch)",
        args=("--batch", "1", "--seq", "64"))
    run("hf_batch_zero", LLAMA, "--batch", "a batch of 0 samples", args=("--batch", "0", "--seq", "8"))
    run("hf_seq_zero", LLAMA, "--seq", "0 tokens per sample", args=("--batch", "1", "--seq", "0"))
    run("hf_defaults_ok", {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
                           "num_hidden_layers": 1, "vocab_size": 128}, "",
        "keys left out take LlamaConfig's defaults (intermediate_size 11008): transformers accepts it",
        exit=0)
    run("hf_lora_rank_zero", LLAMA, "--lora-r", "peft: LoRA rank 0",
        args=("--batch", "1", "--seq", "8", "--lora-r", "0"))
    run("hf_lora_target_missing", LLAMA, "nonexistent_proj",
        "peft: Target modules {'nonexistent_proj'} not found in the base model",
        args=("--batch", "1", "--seq", "8", "--lora-r", "4", "--lora-targets", "nonexistent_proj"))
    llama_ok = put("_ok_llama.config.json", json.dumps(LLAMA, indent=2))
    bert = "fixtures/hf/cases/bert_t.config.json"
    base = ["run", llama_ok, "--batch", "1", "--seq", "8"]
    case("hf_new_tokens_zero", base + ["--mode", "generate", "--new-tokens", "0"], "--new-tokens",
         "generate(max_new_tokens=0): transformers refuses it; the message must name --new-tokens")
    case("hf_new_tokens_huge", base + ["--mode", "generate", "--new-tokens", "99999999999"], "--new-tokens",
         "a hundred billion new tokens: bounded, and the message names the flag, not an internal range()")
    case("hf_generate_without_new_tokens", base + ["--mode", "generate"], "--new-tokens",
         "--mode generate without saying how many tokens")
    case("hf_bert_generate", ["run", bert, "--batch", "1", "--seq", "8", "--mode", "generate",
                              "--new-tokens", "4"], "--mode",
         "transformers: BERT is not compatible with .generate(); the message must say so, naming --mode")
    case("hf_lora_targets_without_r", base + ["--lora-targets", "q_proj"], "--lora-r",
         "--lora-targets without --lora-r")
    case("hf_dir_without_config", ["run", putdir("hf_dir_no_config"), "--batch", "1", "--seq", "8"],
         "config.json", "a model folder holding no config.json")


# ----------------------------------------------------------------------------------------------
# snapshots: PyTorch (pickle, JSON) and gpumem's JSON
# ----------------------------------------------------------------------------------------------

FRAMES = [{"filename": "train.py", "line": 10, "name": "forward"}]


def blk(addr, size, state, req=None):
    return {"address": addr, "size": size, "requested_size": size if req is None else req,
            "state": state, "frames": FRAMES}


def ev(action, addr, size):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": FRAMES}


def torch_snapshot():
    seg = {"device": 0, "address": BASE, "total_size": 2 * MIB, "stream": 0, "segment_type": "small",
           "allocated_size": 1024, "active_size": 1024, "requested_size": 1000,
           "blocks": [blk(BASE, 512, "active_allocated", 500), blk(BASE + 512, 512, "active_allocated", 500),
                      blk(BASE + 1024, 2 * MIB - 1024, "inactive", 0)]}
    trace = [ev("segment_alloc", BASE, 2 * MIB), ev("alloc", BASE, 512), ev("alloc", BASE + 512, 512),
             ev("alloc", BASE + 1024, 512), ev("free_requested", BASE + 1024, 512),
             ev("free_completed", BASE + 1024, 512)]
    return {"segments": [seg], "device_traces": [trace]}


def gpumem_snapshot():
    seg = {"address": BASE, "total_size": 2 * MIB, "allocated_size": 1024, "active_size": 1024,
           "requested_size": 1000, "stream": 0, "segment_type": "small", "device": 0,
           "blocks": [{"address": BASE, "size": 512, "requested_size": 500, "state": "active_allocated",
                       "stack": 0},
                      {"address": BASE + 512, "size": 512, "requested_size": 500, "state": "active_allocated",
                       "stack": 1},
                      {"address": BASE + 1024, "size": 2 * MIB - 1024, "requested_size": 0,
                       "state": "inactive"}]}
    events = [{"action": "segment_alloc", "addr": BASE, "size": 2 * MIB, "stack": 0, "stream": 0},
              {"action": "alloc", "addr": BASE, "size": 512, "stack": 0, "stream": 0},
              {"action": "alloc", "addr": BASE + 512, "size": 512, "stack": 1, "stream": 0}]
    return {"format": "gpumem-snapshot", "version": 2, "generator": "gpumem 0.1.0",
            "source": {"kind": "run", "name": "s", "workload": "s.toml"},
            "device": {"kind": "sim", "total_memory": 80 * 1024 ** 3, "context_overhead": 0},
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False},
            "stacks": [["iter:0", "phase:forward", "randn", "category:parameter"],
                       ["iter:0", "phase:forward", "mul", "category:activation"]],
            "segments": [seg], "trace": {"dropped": 0, "events": events}}


def pk(obj):
    return pickle.dumps(obj, protocol=4)


def snapshots():
    ok_json = put("_ok_snapshot.json", json.dumps(torch_snapshot(), indent=1))
    put("_ok_snapshot.pickle", pk(torch_snapshot()))

    def summ(name, data, contains, why, exit=2, ext="json", cmd=("summary",), extra=()):
        if not isinstance(data, (bytes, str)):
            data = json.dumps(data, indent=1) if ext == "json" else pk(data)
        p = put(f"{name}.{ext}", data)
        case(name, [*cmd, p, *extra], contains, why, exit)

    def mutate(fn):
        s = torch_snapshot()
        fn(s)
        return s

    good = pk(torch_snapshot())
    goodj = json.dumps(torch_snapshot(), indent=1)
    seg0 = lambda s: s["segments"][0]
    trace0 = lambda s: s["device_traces"][0]

    # the file
    summ("s_empty_pickle", b"", "s_empty_pickle.pickle", "an empty file", ext="pickle")
    summ("s_empty_json", "", "s_empty_json.json", "an empty file")
    summ("s_truncated_pickle", good[: len(good) // 2], "s_truncated_pickle.pickle",
         "a pickle cut in half (a copy that did not finish)", ext="pickle")
    summ("s_truncated_json", goodj[: len(goodj) // 2], "s_truncated_json.json", "JSON cut in half")
    summ("s_pickle_no_stop", good[:-1], "s_pickle_no_stop.pickle",
         "a pickle missing only its final STOP opcode", ext="pickle")
    summ("s_pickle_trailing_bytes", good + b"\x00garbage after STOP", "",
         "bytes after STOP: pickle.load stops at STOP, so PyTorch's tools read it", exit=0, ext="pickle")
    summ("s_binary_garbage", garbage(4096, "snap"), "s_binary_garbage.pickle", "random bytes",
         ext="pickle")
    summ("s_pickle_protocol_99", b"\x80\x63" + good[2:], "s_pickle_protocol_99.pickle",
         "an unknown pickle protocol (pickle: unsupported pickle protocol: 99)", ext="pickle")
    summ("s_pickle_evil_reduce",
         b"\x80\x02cposix\nsystem\nq\x00X\x10\x00\x00\x00touch /tmp/pwnedq\x01\x85q\x02Rq\x03.",
         "s_pickle_evil_reduce.pickle", "GLOBAL posix.system + REDUCE: must be refused, never run",
         ext="pickle")
    summ("s_pickle_class_instance",
         b"\x80\x02c__main__\nSnapshot\nq\x00)\x81q\x01}q\x02X\x08\x00\x00\x00segmentsq\x03]q\x04sb.",
         "s_pickle_class_instance.pickle", "an instance of a class (NEWOBJ + BUILD)", ext="pickle")
    summ("s_pickle_deep_nesting", b"\x80\x04" + b"]" * 50_000 + b"a" * 49_999 + b".",
         "s_pickle_deep_nesting.pickle", "a list nested 50,000 deep (stack overflow bait)", ext="pickle")
    summ("s_json_deep_nesting", "[" * 50_000 + "]" * 50_000, "s_json_deep_nesting.json",
         "an array nested 50,000 deep")
    summ("s_pickle_bad_utf8",
         b"\x80\x04}\x94\x8c\x08segments\x94]\x94s\x8c\x04\xff\xfe\xfd\xfc\x94]\x94s.",
         "s_pickle_bad_utf8.pickle", "a string that is not UTF-8 (pickle: UnicodeDecodeError)",
         ext="pickle")
    summ("s_json_bom", "\ufeff" + goodj, "s_json_bom.json",
         "a UTF-8 BOM: json.load raises 'Unexpected UTF-8 BOM'")
    summ("s_json_crlf_ok", goodj.replace("\n", "\r\n"), "", "CRLF is JSON whitespace: accepted", exit=0)
    summ("s_json_nan", goodj.replace('"total_size": %d' % (2 * MIB), '"total_size": NaN'), "line",
         "NaN for a size (Python's json writes it)")
    case("s_directory", ["summary", putdir("s_dir.pickle")], "s_dir.pickle",
         "a directory named like a snapshot")
    case("s_nonexistent", ["summary", f"{REL}/no_such_snapshot.pickle"], "no_such_snapshot.pickle",
         "a snapshot path that does not exist")
    case("s_second_rank_bad", ["summary", ok_json, put("s_rank1_truncated.json", goodj[:100])],
         "s_rank1_truncated.json", "the second of two ranks is truncated: the message names that one")

    # the document
    summ("s_not_dict_pickle", [1, 2, 3], "s_not_dict_pickle.pickle", "a pickled list", ext="pickle")
    summ("s_empty_dict_pickle", {}, "segments", "an empty dict", ext="pickle")
    summ("s_missing_segments_pickle", {"device_traces": [[]]}, "'segments'", "no 'segments' key",
         ext="pickle")
    summ("s_missing_segments_json", {"device_traces": [[]]}, "'segments'", "no 'segments' key")
    summ("s_segments_typo", {"segmnets": [], "device_traces": [[]]}, "'segments'",
         "'segments' misspelt")
    summ("s_segments_dict_pickle", {"segments": {"0": torch_snapshot()["segments"][0]},
                                    "device_traces": [[]]}, "'segments'",
         "'segments' is a dict, not a list", ext="pickle")
    summ("s_segments_string_json", {"segments": "none", "device_traces": [[]]}, "'segments'",
         "'segments' is a string")
    summ("s_segments_int_json", {"segments": 5, "device_traces": [[]]}, "'segments'",
         "'segments' is a number")
    summ("s_device_traces_not_list", mutate(lambda s: s.update(device_traces={"0": []})),
         "'device_traces'", "'device_traces' is a dict")
    summ("s_segment_not_dict", mutate(lambda s: s["segments"].append([1, 2])), "segments[1]",
         "a segment that is a list")
    summ("s_segment_missing_address", mutate(lambda s: seg0(s).pop("address")), "segments[0].address",
         "a segment without its address")
    summ("s_segment_size_string", mutate(lambda s: seg0(s).update(total_size="2MiB")), "total_size",
         "a segment size as a string")
    summ("s_segment_negative_address", mutate(lambda s: seg0(s).update(address=-4096)), "segments[0].address",
         "a negative segment address")
    summ("s_segments_overlap", mutate(lambda s: s["segments"].append(
        dict(seg0(s), address=BASE + MIB))), "overlaps", "two segments overlapping by 1 MiB")
    summ("s_blocks_not_list", mutate(lambda s: seg0(s).update(blocks={"a": 1})), "segments[0].blocks",
         "'blocks' is a dict")
    summ("s_blocks_gap", mutate(lambda s: seg0(s)["blocks"].pop(1)), "segments[0].blocks",
         "a 512-byte hole between two blocks: blocks do not tile the segment")
    summ("s_blocks_short", mutate(lambda s: seg0(s)["blocks"].pop()), "segments[0]",
         "blocks end 2 MiB - 1 KiB before the segment does")
    summ("s_blocks_overlap", mutate(lambda s: seg0(s)["blocks"][1].update(address=BASE + 256)),
         "segments[0].blocks[1]", "a block starting inside the one before it")
    summ("s_blocks_unsorted", mutate(lambda s: seg0(s)["blocks"].reverse()), "segments[0].blocks",
         "blocks in reverse address order: PyTorch writes them sorted")
    summ("s_block_outside", mutate(lambda s: seg0(s)["blocks"].append(blk(BASE + 4 * MIB, 512, "inactive"))),
         "segments[0].blocks[3]", "a block past the end of its segment")
    summ("s_block_size_negative", mutate(lambda s: seg0(s)["blocks"][0].update(size=-512)),
         "segments[0].blocks[0]", "a negative block size")
    summ("s_block_size_huge", mutate(lambda s: seg0(s)["blocks"][0].update(size=2 ** 70)),
         "segments[0].blocks[0]", "a block size past 2^64")
    summ("s_block_unknown_state", mutate(lambda s: seg0(s)["blocks"][0].update(state="zombie")),
         "zombie", "a block state PyTorch does not write")
    summ("s_block_requested_too_big", mutate(lambda s: seg0(s)["blocks"][0].update(requested_size=4096)),
         "segments[0].blocks[0]", "a block that asked for more than it holds")
    summ("s_frames_not_list", mutate(lambda s: seg0(s)["blocks"][0].update(frames="train.py:10")),
         "segments[0].blocks[0].frames", "frames given as one string")

    # the trace
    summ("s_trace_double_free", mutate(lambda s: trace0(s).extend(
        [ev("free_requested", BASE + 1024, 512), ev("free_completed", BASE + 1024, 512)])),
        "device_traces[0][6]", "a block freed twice")
    summ("s_trace_double_free_pickle", mutate(lambda s: trace0(s).extend(
        [ev("free_requested", BASE + 1024, 512), ev("free_completed", BASE + 1024, 512)])),
        "device_traces[0][6]", "a block freed twice (pickle)", ext="pickle")
    def free_size(s):
        trace0(s)[4] = ev("free_requested", BASE + 1024, 4096)
        trace0(s)[5] = ev("free_completed", BASE + 1024, 4096)
    summ("s_trace_free_size_mismatch", mutate(free_size), "device_traces[0][4]",
         "a free of 4096 bytes where 512 were allocated")
    summ("s_trace_segment_free_busy", mutate(lambda s: trace0(s).append(ev("segment_free", BASE, 2 * MIB))),
         "device_traces[0][6]", "segment_free while two of its blocks are allocated")
    summ("s_trace_alloc_twice", mutate(lambda s: trace0(s).insert(3, ev("alloc", BASE + 512, 512))),
         "device_traces[0][3]", "an address allocated again while still allocated")
    summ("s_trace_entry_missing_addr", mutate(lambda s: trace0(s)[1].pop("addr")), "device_traces[0][1]",
         "a trace entry without its address")
    summ("s_trace_size_string", mutate(lambda s: trace0(s)[1].update(size="512")), "device_traces[0][1]",
         "a trace entry's size as a string")
    def unrecorded(s):
        s["segments"].append({"device": 0, "address": BASE + 8 * MIB, "total_size": 2 * MIB, "stream": 0,
                              "segment_type": "small", "blocks": [blk(BASE + 8 * MIB, 2 * MIB, "inactive", 0)]})
        trace0(s).extend([ev("free_requested", BASE + 8 * MIB, 1024), ev("free_completed", BASE + 8 * MIB, 1024)])
    summ("s_trace_free_unrecorded_ok", mutate(unrecorded), "",
         "a free of a block allocated before recording began: PyTorch's ring buffer writes such traces",
         exit=0)

    # gpumem's own snapshot
    def gsnap(fn):
        g = gpumem_snapshot()
        fn(g)
        return g

    put("_ok_gpumem_snapshot.json", json.dumps(gpumem_snapshot(), indent=1))
    summ("s_gpumem_version_99", gsnap(lambda g: g.update(version=99)), "version 99",
         "a gpumem snapshot from a future version")
    summ("s_gpumem_stack_out_of_range", gsnap(lambda g: g["segments"][0]["blocks"][0].update(stack=99)),
         "segments[0].blocks[0]", "a block's stack index past the stacks list")
    summ("s_gpumem_missing_segments", gsnap(lambda g: g.pop("segments")), "'segments'",
         "a gpumem snapshot without segments")
    summ("s_gpumem_events_not_list", gsnap(lambda g: g["trace"].update(events={"0": 1})), "trace.events",
         "trace.events is a dict")

    # other commands given bad snapshots
    case("s_export_missing_segments", ["export", f"{REL}/s_missing_segments_json.json", "--to",
                                       "torch-json", "-o", "$TMP/out.json"], "'segments'",
         "export of a snapshot without segments")
    case("s_plot_blocks_gap", ["plot", f"{REL}/s_blocks_gap.json", "-o", "$TMP/t.svg"],
         "segments[0].blocks", "plot of a snapshot whose blocks do not tile their segment")
    case("s_diff_second_bad", ["diff", ok_json, f"{REL}/s_segments_dict_pickle.pickle"],
         "s_segments_dict_pickle.pickle", "diff where B is malformed: the message names B")
    case("s_replay_double_free", ["replay", f"{REL}/s_trace_double_free.json", "--alloc-conf",
                                  "expandable_segments:True"], "device_traces[0][6]",
         "a what-if replay of a trace that frees a block twice")


# ----------------------------------------------------------------------------------------------
# allocator traces (gpumem replay)
# ----------------------------------------------------------------------------------------------

def trace_doc(**kv):
    d = {"kind": "bad", "seed": 0, "alloc_conf": "", "memory_fraction": 0.0,
         "device_total_memory": 8 * 1024 ** 3, "torch_version": "2.11.0", "device_name": "sim",
         "ops": [["a", 0, 512], ["a", 1, 1000], ["f", 0], ["e"]]}
    for k, v in kv.items():
        if v is None:
            d.pop(k)
        else:
            d[k] = v
    return d


def traces():
    put("_ok_trace.json", json.dumps(trace_doc()))

    def rep(name, data, contains, why, exit=2, extra=(), fname=None):
        if not isinstance(data, (bytes, str)):
            data = json.dumps(data, indent=1)
        p = put(fname or f"{name}.json", data)
        case(name, ["replay", p, *extra], contains, why, exit)

    good = json.dumps(trace_doc(), indent=1)
    rep("t_empty", "", "t_empty.json", "an empty trace file")
    rep("t_truncated", good[: len(good) // 2], "t_truncated.json", "a trace cut in half")
    rep("t_binary_garbage", garbage(1500, "trace"), "t_binary_garbage.json", "random bytes")
    rep("t_bom", "\ufeff" + good, "t_bom.json", "a UTF-8 BOM: json.load refuses it")
    rep("t_not_object", json.dumps(trace_doc()["ops"]), "ops",
        "only the ops list, not the object holding it: the message should say a trace needs an `ops` key")
    rep("t_missing_ops", trace_doc(ops=None), "ops", "no 'ops'", fname="t_no_op_list.json")
    rep("t_ops_not_list", trace_doc(ops={"0": ["a", 0, 512]}),
        line_of(json.dumps(trace_doc(ops={}), indent=1), '"ops"'), "'ops' is a dict")
    rep("t_op_unknown", trace_doc(ops=[["a", 0, 512], ["m", 0]]), "ops[1]", "an op 'm'")
    rep("t_op_wrong_arity", trace_doc(ops=[["a", 0]]), "ops[0]", "an alloc without its size")
    rep("t_op_negative_size", trace_doc(ops=[["a", 0, -512]]), "ops[0]", "a negative size")
    rep("t_op_size_string", trace_doc(ops=[["a", 0, "512"]]), "ops[0]", "a size as a string")
    rep("t_op_id_huge", trace_doc(ops=[["a", 2 ** 64, 512]]), "ops[0]", "an id past 2^64")
    rep("t_double_free", trace_doc(ops=[["a", 0, 512], ["f", 0], ["f", 0]]), "ops[2]", "a double free")
    rep("t_free_never_allocated", trace_doc(ops=[["a", 0, 512], ["f", 7]]), "ops[1]",
        "a free of an id never allocated")
    rep("t_alloc_live_id", trace_doc(ops=[["a", 0, 512], ["a", 0, 512]]), "ops[1]",
        "an id allocated twice while live")
    rep("t_after_row_count", trace_doc(after_columns=["allocated_bytes"], after=[[512]]), ": after:",
        "one after row for four ops")
    rep("t_after_row_width", trace_doc(after_columns=["allocated_bytes"], after=[[512, 1]] * 4),
        "after[0]", "two values for one column")
    rep("t_after_unknown_column", trace_doc(after_columns=["allocated_byte"], after=[[0]] * 4),
        "allocated_byte", "a misspelt column")
    rep("t_after_without_columns", trace_doc(after=[[0]] * 4), "after_columns",
        "rows without their column names")
    rep("t_oom_bad_step", trace_doc(ooms=[{"step": 9, "id": 0, "size": 512}]), "ooms[0]",
        "an out-of-memory at a step that does not exist")
    rep("t_device_memory_zero", trace_doc(device_total_memory=0), "device_total_memory",
        "a device of 0 bytes")
    rep("t_device_memory_negative", trace_doc(device_total_memory=-1),
        line_of(json.dumps(trace_doc(), indent=1), '"device_total_memory"'),
        "a negative device size")
    rep("t_memory_fraction_high", trace_doc(memory_fraction=1.5), ": memory_fraction:",
        "PyTorch: set_per_process_memory_fraction: invalid fraction 1.5, must be between 0 and 1")
    rep("t_trace_entry_bad", trace_doc(trace=[["alloc", "0x10", 512]]), "trace[0]",
        "a device trace entry whose address is a string")
    rep("t_stats_end_not_map", trace_doc(stats_end=[1, 2]),
        line_of(json.dumps(trace_doc(stats_end=[1, 2]), indent=1), '"stats_end"'), "stats_end as a list")
    rep("t_alloc_conf_bad", trace_doc(alloc_conf="expandable_segments:Maybe"), ": alloc_conf:",
        "PyTorch: Expected a single True/False argument for expandable_segments")
    rep("t_ops_deep_nesting", '{"ops": ' + "[" * 20_000 + "]" * 20_000 + "}", "t_ops_deep_nesting.json",
        "ops nested 20,000 deep")


# ----------------------------------------------------------------------------------------------
# baselines (gpumem check --baseline)
# ----------------------------------------------------------------------------------------------

def baseline_doc(entry_over=None, **top):
    entry = {"source": "fixtures/bad/corpus/_ok_tiny.toml", "gpumem_version": "0.1.0",
             "peak_allocated": 3072, "peak_reserved": 2097152, "leak_per_iteration": 0, "oom": False,
             "categories_at_peak": {"gradient": 1024, "parameter": 512, "temporary": 1536},
             "top_tags_at_peak": {}}
    if entry_over:
        for k, v in entry_over.items():
            if v is None:
                entry.pop(k)
            else:
                entry[k] = v
    d = {"gpumem_baseline": 1, "entries": {"t": entry}}
    for k, v in top.items():
        if v is None:
            d.pop(k)
        else:
            d[k] = v
    return d


def baselines(ok_toml):
    put("_ok_baseline.json", json.dumps(baseline_doc(), indent=2, sort_keys=True))

    def chk(name, data, contains, why, exit=2):
        if not isinstance(data, (bytes, str)):
            data = json.dumps(data, indent=2)
        p = put(f"{name}.json", data)
        case(name, ["check", ok_toml, "--baseline", p], contains, why, exit)

    good = json.dumps(baseline_doc(), indent=2)
    chk("b_empty", "", "b_empty.json", "an empty baseline")
    chk("b_truncated", good[: len(good) // 2], "b_truncated.json", "a baseline cut in half (merge gone wrong)")
    chk("b_merge_conflict", good.replace('"peak_reserved"', '<<<<<<< HEAD\n    "peak_reserved"', 1),
        "b_merge_conflict.json", "git conflict markers left in the file")
    chk("b_binary_garbage", garbage(1000, "baseline"), "b_binary_garbage.json", "random bytes")
    chk("b_missing_entries", baseline_doc(entries=None), "missing field `entries`",
        "no 'entries': a malformed baseline, not a regression")
    chk("b_entries_list", baseline_doc(entries=[]), line_of(good, '"entries"'), "'entries' is a list")
    chk("b_version_99", baseline_doc(gpumem_baseline=99), "gpumem_baseline",
        "a baseline format from the future")
    chk("b_missing_version", baseline_doc(gpumem_baseline=None), "gpumem_baseline",
        "no format marker: is this a baseline at all?")
    chk("b_entry_not_object", baseline_doc(entries={"t": 5}), line_of(good, '"t"'), "an entry that is a number")
    chk("b_peak_string", baseline_doc({"peak_allocated": "lots"}), line_of(good, '"peak_allocated"'),
        "a peak that is not a size")
    chk("b_peak_negative", baseline_doc({"peak_allocated": -5}), line_of(good, '"peak_allocated"'), "a negative peak")
    chk("b_check_bad_tolerance", baseline_doc({"check": {"tolerance": "two percent"}}), "check.tolerance",
        "a tolerance that is not a percentage")
    chk("b_check_unknown_key", baseline_doc({"check": {"tolerence": "2%"}}), "tolerence",
        "a misspelt check key")
    chk("b_bom", "\ufeff" + good, "b_bom.json", "a UTF-8 BOM before the baseline")
    chk("b_toml_not_json", OK_TOML, "b_toml_not_json.json", "a workload given as the baseline")
    case("b_directory", ["check", ok_toml, "--baseline", putdir("b_dir.json")], "b_dir.json",
         "a directory given as the baseline")
    case("b_nonexistent", ["check", ok_toml, "--baseline", f"{REL}/no_such_baseline.json"],
         "no_such_baseline.json", "a baseline that does not exist, without --update")


# ----------------------------------------------------------------------------------------------
# flags, sizes, counts, --alloc-conf, --param, the environment
# ----------------------------------------------------------------------------------------------

def flags(ok_toml):
    mlp = "fixtures/workloads/presets/mlp_sgd.toml"
    snap = f"{REL}/_ok_snapshot.json"

    def f(name, args, contains, why, exit=2, env=None):
        case(name, args, contains, why, exit, env)

    f("f_bench_repeat_huge", ["bench", "--repeat", "100000000"], "--repeat",
      "a hundred million repetitions")
    f("f_bench_warmup_huge", ["bench", "--warmup-ms", "99999999999"], "--warmup-ms",
      "three years of warm-up")
    f("f_bench_pairs_reps_huge", ["bench", "--pairs-reps", "100000000"], "--pairs-reps",
      "a hundred million passes")
    # sizes
    for n, v, why in [("f_capacity_negative", "-5GiB", "a negative size"),
                      ("f_capacity_word", "lots", "not a size"),
                      ("f_capacity_zero", "0", "a device of 0 bytes"),
                      ("f_capacity_typo_unit", "24GiBs", "an unknown unit"),
                      ("f_capacity_empty", "", "an empty size"),
                      ("f_capacity_two_dots", "1.5.3GiB", "a malformed number"),
                      ("f_capacity_huge", "1024TiB", "past the simulated address space"),
                      ("f_capacity_u64_overflow", "99999999999999999999", "past 2^64 bytes"),
                      ("f_capacity_nan", "NaNGiB", "NaN"),
                      ("f_capacity_inf", "infGiB", "infinity")]:
        f(n, ["run", ok_toml, "--capacity", v], "--capacity", why)
    f("f_capacity_fractional_bytes", ["run", ok_toml, "--capacity", "1.5B"], "--capacity",
      "1.5 bytes: a byte count must be whole (it is rounded to 2 B today)")
    f("f_fit_capacity_bad", ["fit", mlp, "--capacity", "24XB", "--no-remedies"], "--capacity",
      "fit with an unknown unit")
    f("f_replay_capacity_zero", ["replay", snap, "--capacity", "0"], "--capacity",
      "a what-if replay on a device of 0 bytes")
    # counts
    f("f_iterations_zero", ["run", ok_toml, "--iterations", "0"], "--iterations", "zero iterations")
    f("f_iterations_negative", ["run", ok_toml, "--iterations", "-1"], "--iterations",
      "negative iterations (not a flag named -1)")
    f("f_iterations_overflow", ["run", ok_toml, "--iterations", "99999999999999999999"], "--iterations",
      "past u64")
    f("f_iterations_huge", ["run", ok_toml, "--iterations", "4294967295"], "--iterations",
      "more iterations than gpumem bounds")
    f("f_batch_zero", ["run", mlp, "--batch", "0"], "--batch", "a batch of 0")
    f("f_batch_word", ["run", mlp, "--batch", "eight"], "--batch", "a batch that is a word")
    f("f_summary_top_negative", ["summary", snap, "--top", "-1"], "--top", "a negative count")
    f("f_plot_samples_zero", ["plot", snap, "-o", "$TMP/t.svg", "--samples", "0"], "--samples",
      "a timeline of 0 points")
    f("f_fit_max_zero", ["fit", mlp, "--max", "0", "--no-remedies"], "--max", "a search up to 0")
    f("f_replay_max_mismatches_negative", ["replay", f"{REL}/_ok_trace.json", "--max-mismatches", "-3"],
      "--max-mismatches", "a negative count")
    f("f_device_missing", ["summary", snap, "--device", "5"], "--device",
      "cuda:5 in a snapshot of one device")
    f("f_device_negative", ["summary", snap, "--device", "-1"], "--device", "a negative device")
    f("f_seq_huge", ["run", "fixtures/hf/cases/llama_t.config.json", "--batch", "1", "--seq",
                     "18446744073709551615"], "--seq", "u64::MAX tokens")
    # --param
    f("f_param_no_equals", ["run", mlp, "--param", "batch"], "--param", "NAME without =VALUE")
    f("f_param_no_name", ["run", mlp, "--param", "=8"], "--param", "=VALUE without a NAME")
    f("f_param_word", ["run", mlp, "--param", "batch=eight"], "--param", "a value that is a word")
    f("f_param_negative", ["run", mlp, "--param", "batch=-1"], "--param", "a negative batch")
    f("f_param_float", ["run", mlp, "--param", "batch=1e3"], "--param", "an integer written as a float")
    f("f_param_unknown", ["run", mlp, "--param", "bacth=8"], "--param", "a misspelt parameter")
    f("f_param_script_undeclared", ["run", ok_toml, "--param", "batch=8"], "--param",
      "a parameter the script does not declare")
    f("f_check_param_unknown", ["check", ok_toml, "--param", "batch=8", "--budget", "peak_reserved=1GiB"],
      "--param", "check --param that the workload lacks")
    # --alloc-conf and the environment
    for n, v, key, why in [
            ("f_alloc_conf_bool_maybe", "expandable_segments:Maybe", "expandable_segments",
             "PyTorch: Expected a single True/False argument for expandable_segments"),
            ("f_alloc_conf_unknown_key", "expandable_segment:True", "expandable_segment",
             "PyTorch: Unrecognized key 'expandable_segment' in CUDA allocator config"),
            ("f_alloc_conf_equals", "expandable_segments=True", "expandable_segments",
             "'=' instead of ':'"),
            ("f_alloc_conf_split_word", "max_split_size_mb:abc", "max_split_size_mb", "a size that is a word"),
            ("f_alloc_conf_split_negative", "max_split_size_mb:-1", "max_split_size_mb", "a negative size"),
            ("f_alloc_conf_split_too_small", "max_split_size_mb:10", "max_split_size_mb",
             "PyTorch: CachingAllocator option max_split_size_mb too small, must be > 20"),
            ("f_alloc_conf_gc_threshold_high", "garbage_collection_threshold:1.5", "garbage_collection_threshold",
             "PyTorch: garbage_collect_threshold too big, set it 0.0~1.0"),
            ("f_alloc_conf_roundup_not_pow2", "roundup_power2_divisions:3", "roundup_power2_divisions",
             "PyTorch: For roundups, the divisions has to be power of 2"),
            ("f_alloc_conf_roundup_bad_list", "roundup_power2_divisions:[256:4,>:x]", "roundup_power2_divisions",
             "a divisions list with a word for a count"),
            ("f_alloc_conf_missing_value", "max_split_size_mb", "max_split_size_mb", "a key without ':VALUE'"),
            ("f_alloc_conf_non_ascii", "expandable_segments:Tru\u00e9", "expandable_segments", "a non-ASCII value")]:
        f(n, ["run", ok_toml, "--alloc-conf", v], "--alloc-conf", why)
    f("f_alloc_conf_replay_bad", ["replay", f"{REL}/_ok_trace.json", "--alloc-conf", "max_split_size_mb:abc"],
      "--alloc-conf", "replay with a malformed --alloc-conf")
    f("f_alloc_conf_backend_async", ["run", ok_toml, "--alloc-conf", "backend:cudaMallocAsync"], "--alloc-conf",
      "PyTorch accepts it, but gpumem models only the native allocator: refused by name")
    f("f_alloc_conf_empty_ok", ["run", ok_toml, "--alloc-conf", ""], "",
      "an empty setting string: PyTorch's defaults", exit=0)
    f("f_alloc_conf_lowercase_true_ok", ["run", ok_toml, "--alloc-conf", "expandable_segments:true"], "",
      "PyTorch 2.11 reads true as True", exit=0)
    f("f_env_alloc_conf_bad", ["run", ok_toml], "PYTORCH_CUDA_ALLOC_CONF",
      "the environment's PYTORCH_CUDA_ALLOC_CONF is malformed: name the variable",
      env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:Maybe"})
    f("f_env_alloc_conf_unknown_key", ["run", ok_toml], "PYTORCH_CUDA_ALLOC_CONF",
      "PyTorch raises on an unknown key in PYTORCH_CUDA_ALLOC_CONF",
      env={"PYTORCH_CUDA_ALLOC_CONF": "max_splt_size_mb:128"})
    f("f_env_alloc_conf_new_name_bad", ["run", ok_toml], "PYTORCH_ALLOC_CONF",
      "the newer variable name, malformed", env={"PYTORCH_ALLOC_CONF": "max_split_size_mb:abc"})
    f("f_env_threads_word", ["summary", snap], "",
      "GPUMEM_THREADS that is not a number falls back to every core (as RAYON_NUM_THREADS does)", exit=0,
      env={"GPUMEM_THREADS": "many"})
    # tolerances, budgets, choices
    f("f_tolerance_word", ["check", ok_toml, "--baseline", f"{REL}/_ok_baseline.json", "--tolerance", "lots"],
      "--tolerance", "a tolerance that is not a percentage")
    f("f_tolerance_unknown_metric",
      ["check", ok_toml, "--baseline", f"{REL}/_ok_baseline.json", "--tolerance", "peak_reserverd=1%"],
      "--tolerance", "a misspelt metric")
    f("f_tolerance_negative",
      ["check", ok_toml, "--baseline", f"{REL}/_ok_baseline.json", "--tolerance", "-2%"],
      "--tolerance", "a negative tolerance")
    f("f_budget_no_equals", ["check", ok_toml, "--budget", "peak_reserved"], "--budget", "METRIC without =SIZE")
    f("f_budget_bad_size", ["check", ok_toml, "--budget", "peak_reserved=20GB!"], "--budget", "a malformed size")
    f("f_budget_unknown_metric", ["check", ok_toml, "--budget", "peak_reservd=1GiB"], "--budget",
      "a misspelt metric")
    f("f_fail_on_unknown", ["run", ok_toml, "--fail-on", "ooms"], "--fail-on", "'ooms' is not a finding")
    f("f_report_unknown", ["run", ok_toml, "--report", "fragmentaton"], "--report", "a misspelt report")
    f("f_export_to_unknown", ["export", snap, "--to", "pdf", "-o", "$TMP/x.pdf"], "--to", "an unknown format")
    f("f_export_no_output", ["export", snap, "--to", "torch-json"], "--output", "export without -o")
    f("f_export_output_missing_dir", ["export", snap, "--to", "torch-json", "-o", "$TMP/no/such/dir/x.json"],
      "no/such/dir/x.json", "-o in a directory that does not exist")
    f("f_plot_output_is_dir", ["plot", snap, "-o", "$TMP"], "Is a directory",
      "-o naming a directory (the message gives its path and this reason)")
    f("f_run_snapshot_missing_dir", ["run", ok_toml, "--snapshot", "$TMP/no/dir/s.json"], "no/dir/s.json",
      "--snapshot in a directory that does not exist")
    f("f_summary_no_args", ["summary"], "<SNAPSHOT>", "summary of nothing")
    f("f_device_cuda", ["run", ok_toml, "--device", "cuda"], "--device", "--device cuda on a machine without an NVIDIA driver (CI's)")
    f("f_device_unknown", ["run", ok_toml, "--device", "gpu"], "--device", "a device gpumem does not have")
    f("f_save_grads_sim", ["run", ok_toml, "--save-grads", "$TMP/g.safetensors"], "--save-grads",
      "gradients asked of the simulated device, which has no values")
    f("f_replay_torch_style_alone", ["replay", f"{REL}/_ok_trace.json", "--torch-style"], "--summary",
      "--torch-style without --summary")
    f("f_fit_param_unknown", ["fit", mlp, "--param", "bacth", "--no-remedies"], "--param",
      "fit searching a parameter the workload lacks")
    f("f_optimizer_on_script", ["run", ok_toml, "--optimizer", "adam"], "--optimizer",
      "a bare-config flag given with a script workload")
    f("f_color_unknown", ["run", ok_toml, "--color", "sometimes"], "--color", "an unknown colour mode")
    f("f_unknown_subcommand", ["rnu", ok_toml], "rnu", "a misspelt command")
    f("f_unknown_flag", ["run", ok_toml, "--capacty", "8GiB"], "--capacty", "a misspelt flag")
    f("f_lora_dropout_high", ["run", "fixtures/hf/cases/llama_t.config.json", "--batch", "1", "--seq", "8",
                              "--lora-r", "4", "--lora-dropout", "1.5"], "--lora-dropout",
      "PyTorch: dropout probability has to be between 0 and 1, but got 1.5")
    f("f_lora_alpha_without_r", ["run", "fixtures/hf/cases/llama_t.config.json", "--batch", "1", "--seq", "8",
                                 "--lora-alpha", "16"], "--lora-r", "--lora-alpha without --lora-r")
    f("f_iteration_marker_empty", ["summary", snap, "--iteration-marker", ""], "--iteration-marker",
      "an empty function name")
    # a finding, not an error
    f("f_fail_on_oom_finding", ["run", "fixtures/workloads/capacity_oom.toml", "--fail-on", "oom",
                                "--no-remedies"], "", "a real out-of-memory with --fail-on oom: a finding (exit 1)",
      exit=1)


def write():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    ok = workloads()
    hf()
    snapshots()
    traces()
    baselines(ok)
    flags(ok)
    for name, data in sorted(FILES.items()):
        path = os.path.join(OUT, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
    for c in CASES:
        if c["name"] in WARNED:
            # read as PyTorch's viewer reads it (grown snapshots repeat a trace), with a warning
            c["exit"] = 0
            c["stderr_contains"] = WARNED[c["name"]]
        if c["name"] in REWORDED:
            c["stderr_contains"] = REWORDED[c["name"]]
        if c["name"] in PENDING:
            c["pending"] = PENDING[c["name"]]
    with open(os.path.join(OUT, "manifest.json"), "w") as fh:
        json.dump(CASES, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    kinds = {}
    for c in CASES:
        k = c["name"].split("_")[0]
        kinds[k] = kinds.get(k, 0) + 1
    print(f"wrote {len(FILES)} files and {len(CASES)} cases to {REL}: "
          + ", ".join(f"{k}_ {n}" for k, n in sorted(kinds.items())))


def check(binary):
    """Runs every case; prints those whose exit code or message differs from the manifest."""
    with open(os.path.join(OUT, "manifest.json")) as fh:
        cases = json.load(fh)
    bad = []
    for c in cases:
        tmp = tempfile.mkdtemp(prefix="gpumem-bad-")
        sub = lambda s: s.replace("$TMP", tmp)
        env = dict(os.environ)
        for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "RUST_LOG", "GPUMEM_THREADS"):
            env.pop(k, None)
        env["NO_COLOR"] = "1"
        env.update({k: sub(v) for k, v in c.get("env", {}).items()})
        t0 = time.monotonic()
        try:
            p = subprocess.run([binary, *map(sub, c["args"])], cwd=ROOT, env=env, capture_output=True,
                               timeout=20)
            code, err = p.returncode, p.stderr.decode("utf-8", "replace")
        except subprocess.TimeoutExpired as e:
            code, err = "timeout", (e.stderr or b"").decode("utf-8", "replace")
        secs = round(time.monotonic() - t0, 2)
        shutil.rmtree(tmp, ignore_errors=True)
        want = sub(c["stderr_contains"])
        has = want in err
        first = next((l for l in err.splitlines() if l.strip()), "")
        ok = code == c["exit"] and has
        if not ok:
            bad.append(c["name"])
        print(json.dumps({"name": c["name"], "ok": ok, "exit": code, "want_exit": c["exit"],
                          "contains": has, "secs": secs,
                          "stderr": first[:300]}, ensure_ascii=False))
    print(f"{len(cases) - len(bad)}/{len(cases)} as expected; differing: {' '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    write()
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        sys.exit(check(sys.argv[2]))
    elif len(sys.argv) != 1:
        sys.exit(__doc__)
