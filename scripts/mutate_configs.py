"""Runs gpumem on mutations of the new families' configs (fixtures/hf2 cases and published
ones): every key set in turn to -1, 0, 2**40, a string, null, a list, a map, 1.5 and true.
Each run must end with exit 0, 1 or 2, never a panic or a hang (20 s each).

Usage: python3 scripts/mutate_configs.py [CONFIG ...]   (from the repository root, after
cargo build --release; by default the hf2 cases and a few published configs)
"""
import glob, json, os, subprocess, sys, tempfile
cfgs = sys.argv[1:] or glob.glob('fixtures/hf2/cases/*.config.json') + [f'fixtures/hf/configs/{n}.config.json' for n in ['gemma-2-2b','gemma-3-1b','phi-3-mini-4k','phi-4','qwen3-0.6b','gemma-7b','mixtral-8x7b-v0.1','qwen3-30b-a3b']] + glob.glob('fixtures/moe/*.config.json')
vals = [-1, 0, 2**40, "x", None, [], {}, 1.5, True]
bad = []
n = 0
for c in cfgs:
    base = json.load(open(c))
    for k in list(base.keys()):
        if k in ('id2label','label2id','transformers_version','_name_or_path','architectures'):
            continue
        for v in vals:
            m = dict(base); m[k] = v
            p = os.path.join(tempfile.gettempdir(), 'gpumem_mutated.json')
            json.dump(m, open(p, 'w'))
            try:
                r = subprocess.run(['target/release/gpumem','run',p,'--batch','1','--seq','16','--no-remedies','-q','--capacity','80GiB','--iterations','1'], capture_output=True, text=True, timeout=20)
                code = r.returncode; err = r.stderr
            except subprocess.TimeoutExpired:
                code = 'timeout'; err = ''
            n += 1
            if code not in (0, 1, 2) or 'panicked' in err:
                bad.append((c, k, v, code, err[-300:]))
print(n, 'runs;', len(bad), 'bad')
for b in bad[:30]: print(b)
raise SystemExit(1 if bad else 0)
