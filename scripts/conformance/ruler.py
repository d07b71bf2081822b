"""Regenerate the RULER conformance goldens (tests/fixtures/conformance/ruler/) with the official generators.

    python scripts/conformance/ruler.py --upstream /tmp/upstream/RULER --pydeps /tmp/upstream/pydeps

``--upstream`` is a checkout (or ``git archive``) of NVIDIA/RULER at the commit recorded in the goldens
(``--commit``; checked against ``git rev-parse HEAD`` when the checkout is a git work tree).  Nothing of
it is copied into this repository: its ``scripts/`` folder is copied to a scratch directory, the stand-in
data files of this project are put where upstream reads its data (``scripts/data/synthetic/json/``), and
upstream's own entry point ``scripts/data/prepare.py`` is run once per (template, task, length) through a
small launcher that only (a) adds the SmolLM2 chat template to upstream's template table and (b) turns
``nltk.download`` into a no-op (there is no internet; the punkt_tab data the harness uses is given through
``NLTK_DATA``).  prepare.py then runs the task's generator script in a subprocess, exactly as upstream does.

Upstream needs ``tenacity`` and ``scipy``, which this project's environment does not install; pass a folder
that has them with ``--pydeps`` (e.g. ``pip install --no-deps --target /tmp/upstream/pydeps tenacity scipy``).

Inputs given to both sides:
  * tokenizer: the embedded SmolLM2-135M-Instruct tokenizer (GGUF), saved with ``save_pretrained`` to a
    scratch folder and given to upstream as ``--tokenizer_type hf``;
  * templates: upstream's ``base`` and ``smollm2-chat`` = ``tokenizer.apply_chat_template`` of one user turn
    whose content is ``{task_template}``, with the generation prompt (the harness's chat wrapping; both sides
    then append the answer prefix right after the generation prompt);
  * data: the essay and english-word stand-ins of tests/fixtures/ruler/sources/, and for the two QA tasks
    the larger SQuAD / HotpotQA stand-ins that this script writes to tests/fixtures/conformance/ruler/sources/
    (built deterministically from the essay stand-in, so that the random document draws of upstream's qa.py
    are exercised; the 3-document SQuAD stand-in never reaches them).

Output: ``<out>/<task>.jsonl`` (one line per template x length x sample: the upstream record unchanged, plus
where it came from) and ``<out>/manifest.json`` (commit, command, tokenizer and data hashes, library versions).
Not run in CI.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "tests" / "fixtures" / "conformance" / "ruler"
PROJECT_SOURCES = REPO / "tests" / "fixtures" / "ruler" / "sources"
DEFAULT_COMMIT = "c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a"
TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
         "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2")
TEMPLATES = ("base", "smollm2-chat")
CHAT_TEMPLATE_NAME = "smollm2-chat"
SEED = 42  # upstream's default --random_seed (chunk 0)

# The launcher runs in upstream's environment: register one template, disable downloads, run prepare.py.
LAUNCHER = r'''
import json, os, runpy, sys
data_dir, templates_file = sys.argv[1], sys.argv[2]
sys.path.insert(0, data_dir)
import template
template.Templates.update(json.load(open(templates_file, encoding="utf-8")))
import nltk
nltk.download = lambda *a, **k: True
sys.argv = [os.path.join(data_dir, "prepare.py")] + sys.argv[3:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _shown(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def load_tokenizer():
    import transformers

    sys.path.insert(0, str(REPO))
    from locks.core.embedded_model import smollm2_gguf_path

    p = smollm2_gguf_path()
    return transformers.AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name), p


def chat_model_template(tokenizer) -> str:
    """The harness's chat wrapping as an upstream template string (``{task_template}`` where the user text goes)."""
    marker = "\u0000TASK\u0000"
    wrapped = tokenizer.apply_chat_template([{"role": "user", "content": marker}], add_generation_prompt=True,
                                            tokenize=False)
    if wrapped.count(marker) != 1:
        raise SystemExit("the chat template does not contain the user content exactly once")
    head, tail = wrapped.split(marker)
    esc = lambda s: s.replace("{", "{{").replace("}", "}}")  # noqa: E731  (str.format by upstream)
    if '"' in wrapped:  # prepare.py passes the template to the generator inside double quotes of a shell command
        raise SystemExit("the chat template contains a double quote; upstream's shell command would break it")
    return esc(head) + "{task_template}" + esc(tail)


# ------------------------------------------------------------------------------------------------ QA stand-ins
def build_qa_sources(dest: Path) -> None:
    """SQuAD v2 / HotpotQA-format stand-ins made of the essay stand-in's words (deterministic, no randomness).

    SQuAD: 12 articles x 10 paragraphs of 24 words; one question per paragraph ("which word comes after ..."),
    every fourth one unanswerable (the first one too, so that the filter matters), one with two answers;
    article 3 lists one paragraph twice and article 11 repeats paragraph 0 of article 0 (duplicate contexts).
    HotpotQA: 30 questions with 10 titled context documents each drawn from the same paragraphs, overlapping
    between questions; question 1 lists one context document twice.
    """
    words = json.loads((PROJECT_SOURCES / "PaulGrahamEssays.json").read_text(encoding="utf-8"))["text"].split()
    n_par, per = 120, 24
    if len(words) < n_par * per:
        raise SystemExit("the essay stand-in is too short for the QA stand-ins")
    paras = [" ".join(words[i * per:(i + 1) * per]) for i in range(n_par)]

    def question(ctx: str, q: int, impossible: bool):
        w = ctx.split(" ")
        k = q % (len(w) - 3)
        while len(w[k + 2].strip(".,?!;:")) < 5 and k + 3 < len(w):  # prefer a longer answer word
            k += 1
        ans = w[k + 2]
        qa = {"id": f"q{q}", "question": f"Which word comes right after \"{w[k]} {w[k + 1]}\"?",
              "is_impossible": impossible,
              "answers": [] if impossible else [{"text": ans, "answer_start": ctx.index(f"{w[k]} {w[k + 1]} {ans}")
                                                 + len(w[k]) + len(w[k + 1]) + 2}]}
        if impossible:
            qa["plausible_answers"] = [{"text": ans, "answer_start": 0}]
        elif q == 2:
            qa["answers"].append({"text": f"{w[k + 1]} {ans}", "answer_start": ctx.index(f"{w[k + 1]} {ans}")})
        return qa

    articles, q = [], 0
    for a in range(12):
        ctxs = paras[a * 10:(a + 1) * 10]
        if a == 3:
            ctxs = ctxs + [ctxs[4]]
        if a == 11:
            ctxs = ctxs + [paras[0]]
        ps = []
        for ctx in ctxs:
            ps.append({"context": ctx, "qas": [question(ctx, q, q == 0 or q % 4 == 3)]})
            q += 1
        articles.append({"title": f"Article {a}", "paragraphs": ps})
    squad = {"version": "v2.0", "data": articles}

    def doc(i: int):
        w = paras[i].split(" ")
        return [f"Part {i}", [" ".join(w[:12]) + " ", " ".join(w[12:])]]

    hotpot = []
    for j in range(30):
        idx = [(7 * j + 11 * m) % n_par for m in range(10)]
        ctx = [doc(i) for i in idx]
        if j == 1:
            ctx[9] = ctx[3]
        w = paras[idx[0]].split(" ")
        hotpot.append({"_id": f"h{j}", "question": f"In Part {idx[0]}, which word follows \"{w[5]}\"?",
                       "answer": w[6], "supporting_facts": [[f"Part {idx[0]}", 0], [f"Part {idx[1]}", 1]],
                       "context": ctx, "type": "bridge", "level": "easy"})
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "squad.json").write_text(json.dumps(squad, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")
    (dest / "hotpotqa.json").write_text(json.dumps(hotpot, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------------------------ runs
def run_one(work: Path, python: str, env: dict, tok_dir: Path, templates_file: Path, template: str, task: str,
            length: int, num_samples: int) -> list[dict]:
    data_dir = work / "RULER" / "scripts" / "data"
    save = work / "out" / template / str(length)
    cmd = [python, str(work / "launch.py"), str(data_dir), str(templates_file),
           "--save_dir", str(save), "--benchmark", "synthetic", "--task", task, "--tokenizer_path", str(tok_dir),
           "--tokenizer_type", "hf", "--max_seq_length", str(length), "--model_template_type", template,
           "--num_samples", str(num_samples), "--random_seed", str(SEED)]
    res = subprocess.run(cmd, cwd=str(data_dir), env=env, capture_output=True, text=True)
    out = save / task / "validation.jsonl"
    lines = out.read_text(encoding="utf-8").splitlines() if out.is_file() else []
    if res.returncode != 0 or len(lines) != num_samples:
        raise SystemExit(f"upstream run failed ({template}, {task}, {length}): rc={res.returncode}, "
                         f"{len(lines)} lines\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return [json.loads(line) for line in lines]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", type=Path, required=True, help="NVIDIA/RULER checkout at --commit")
    ap.add_argument("--commit", default=DEFAULT_COMMIT)
    ap.add_argument("--pydeps", type=Path, default=None, help="folder with tenacity and scipy (added to PYTHONPATH)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096])
    ap.add_argument("--num-samples", type=int, default=3)
    ap.add_argument("--tasks", nargs="+", default=list(TASKS))
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()

    up = args.upstream.resolve()
    if not (up / "scripts" / "data" / "prepare.py").is_file():
        raise SystemExit(f"{up}: not a RULER checkout (scripts/data/prepare.py missing)")
    if (up / ".git").exists():
        head = subprocess.run(["git", "-C", str(up), "rev-parse", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        if head != args.commit:
            raise SystemExit(f"{up} is at {head}, expected {args.commit}")

    sys.path.insert(0, str(REPO))
    from eval.ruler.niah import ensure_punkt

    tokenizer, gguf = load_tokenizer()
    chat = chat_model_template(tokenizer)
    qa_sources = args.out / "sources"
    build_qa_sources(qa_sources)

    with tempfile.TemporaryDirectory(prefix="ruler-conformance-") as tmp:
        work = Path(tmp)
        shutil.copytree(up / "scripts", work / "RULER" / "scripts")
        jdir = work / "RULER" / "scripts" / "data" / "synthetic" / "json"
        data_files = {"PaulGrahamEssays.json": PROJECT_SOURCES / "PaulGrahamEssays.json",
                      "english_words.json": PROJECT_SOURCES / "english_words.json",
                      "squad.json": qa_sources / "squad.json", "hotpotqa.json": qa_sources / "hotpotqa.json"}
        for name, src in data_files.items():
            shutil.copyfile(src, jdir / name)
        tok_dir = work / "tokenizer"
        tokenizer.save_pretrained(tok_dir)
        (work / "launch.py").write_text(LAUNCHER, encoding="utf-8")
        templates_file = work / "templates.json"
        templates_file.write_text(json.dumps({CHAT_TEMPLATE_NAME: chat}), encoding="utf-8")
        env = dict(os.environ)
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")  # prepare.py runs `python`
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(args.pydeps.resolve()) if args.pydeps else "",
                                                          env.get("PYTHONPATH", "")) if p)
        env["NLTK_DATA"] = str(Path(ensure_punkt()).parents[2])
        env["HF_HUB_OFFLINE"] = "1"
        env["TOKENIZERS_PARALLELISM"] = "false"

        jobs = [(t, task, L) for task in args.tasks for t in TEMPLATES for L in args.lengths]
        with cf.ThreadPoolExecutor(args.jobs) as ex:
            futs = {j: ex.submit(run_one, work, sys.executable, env, tok_dir, templates_file, *j, args.num_samples)
                    for j in jobs}
            results = {j: f.result() for j, f in futs.items()}

    args.out.mkdir(parents=True, exist_ok=True)
    for task in args.tasks:
        with open(args.out / f"{task}.jsonl", "w", encoding="utf-8") as f:
            for t in TEMPLATES:
                for L in args.lengths:
                    for i, rec in enumerate(results[(t, task, L)]):
                        row = {"task": task, "template": t, "max_seq_length": L, "sample": i, "record": rec}
                        f.write(json.dumps(row, ensure_ascii=True) + "\n")

    def version(pkg):
        paths = [str(args.pydeps)] if args.pydeps else []
        found = [d.version for d in metadata.distributions(name=pkg, path=paths + sys.path)]
        return found[0] if found else None

    manifest = {
        "upstream": "NVIDIA/RULER", "commit": args.commit,
        "command": " ".join(["python", "scripts/conformance/ruler.py", "--upstream", "<RULER checkout>",
                             "--pydeps", "<folder with tenacity, scipy>", "--lengths", *map(str, args.lengths),
                             "--num-samples", str(args.num_samples)]),
        "entry_point": "scripts/data/prepare.py --benchmark synthetic --tokenizer_type hf "
                       f"--random_seed {SEED} --num_samples {args.num_samples}",
        "seed": SEED, "lengths": args.lengths, "num_samples": args.num_samples, "tasks": args.tasks,
        "templates": {"base": "{task_template}", CHAT_TEMPLATE_NAME: chat},
        "tokenizer": {"gguf": gguf.name, "gguf_sha256": sha256(gguf)},
        "data": {name: {"file": _shown(src), "sha256": sha256(src)} for name, src in data_files.items()},
        "versions": {p: version(p) for p in ("transformers", "tokenizers", "wonderwords", "nltk", "numpy", "scipy")},
        "python": sys.version.split()[0],
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(args.tasks)} golden files and manifest.json to {args.out}")


if __name__ == "__main__":
    main()
