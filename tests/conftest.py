"""Test environment (set before anything imports the kernels) and the session fixtures; shared helpers are in
tests/helpers.py. Tests are grouped by layer: core/, methods/, eval/, e2e/."""
import os

import torch

if not torch.cuda.is_available():  # CPU: kernels run under the Triton interpreter (read when they are decorated)
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_SILENT", "true")
# one torch thread per pytest-xdist worker (`make test` runs two), else up to two; the processes a worker starts
# (run.py, the benchmark scripts' dry runs) get one OpenMP thread too: two threads each beside the other worker
# oversubscribe the cores, and their threads' spin-waits then slow both
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if WORKER:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1 if WORKER else max(1, min(2, os.cpu_count() or 1)))

import pytest  # noqa: E402

# submitit configures logging when it is first imported (logging.config.dictConfig), which closes every handler
# there is. Imported inside a test, after rouge_score's absl handler has taken pytest's capture stream as its own,
# that close shuts pytest's capture file and fails every later test of the process; imported here, it closes
# nothing (tests/e2e/test_run.py's in-process runs import it through Hydra's launcher plugins).
import submitit  # noqa: E402, F401

from tests.helpers import WhitespaceTokenizer  # noqa: E402


# the longest files first: pytest-xdist (`--dist loadfile`) hands files to the workers in collection order, and a
# long file started last is the whole run's tail
LONGEST_FIRST = ("tests/e2e/test_bench_e2e.py", "tests/core/test_batch.py", "tests/core/test_static_decode.py",
                 "tests/e2e/test_static_embedded.py", "tests/e2e/test_bench_decode.py", "tests/e2e/test_grouped.py",
                 "tests/e2e/test_rehearse_scale.py", "tests/e2e/test_bench_e2e_late.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def seeded():
    """Every test starts from the same global random state, whichever tests ran before it in its worker (pytest-xdist
    hands files to workers in no fixed order): a test that draws from the global generator draws the same data
    in every run."""
    import random

    import numpy as np

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def session_loads():
    """Models and tokenizers loaded once per session, keyed by their `model` config group: what `load_model` and
    `load_tokenizer` return for that config, the first time through the real loaders."""
    return {}


@pytest.fixture
def shared_models(session_loads, monkeypatch):
    """In-process runs (run.run, eval.runner) load each model config once per session: load_model / load_tokenizer
    answer from `session_loads`, and hand the model back with the harness's attention set, whatever a test did to
    it before."""
    import json

    from omegaconf import OmegaConf

    from locks.core import models
    from locks.core.attention import register_attention

    real_model, real_tokenizer = models.load_model, models.load_tokenizer

    def key(kind, cfg):
        plain = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
        return kind, json.dumps(plain, sort_keys=True, default=str)

    def load_tokenizer(cfg):
        k = key("tokenizer", cfg)
        if k not in session_loads:
            session_loads[k] = real_tokenizer(cfg)
        return session_loads[k]

    def load_model(cfg, tokenizer=None):
        k = key("model", cfg)
        if k not in session_loads:
            session_loads[k] = real_model(cfg, tokenizer)
        loaded = session_loads[k]
        loaded.model.set_attn_implementation(register_attention())
        return loaded

    monkeypatch.setattr(models, "load_model", load_model)
    monkeypatch.setattr(models, "load_tokenizer", load_tokenizer)
    return load_model


@pytest.fixture
def embedded(shared_models):
    """The embedded SmolLM2-135M-Instruct (GGUF, conf/model/smollm2_135m.yaml), loaded once per session with the
    sparse_kv attention: the model every embedded-model test and in-process run shares."""
    from omegaconf import OmegaConf

    from run import CONF

    return shared_models(OmegaConf.load(CONF / "model" / "smollm2_135m.yaml"))


@pytest.fixture(scope="module")
def tok():
    """The embedded model's tokenizer (GGUF), ~3 s to load."""
    import transformers

    from locks.core.embedded_model import smollm2_gguf_path

    p = smollm2_gguf_path()
    return transformers.AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)


@pytest.fixture(scope="module")
def ws():
    return WhitespaceTokenizer()


@pytest.fixture
def default_suite(shared_models, session_loads, tmp_path_factory):
    """default_suite(num_samples, budget=128) -> tests.helpers.default_suite's (config, loaded model, samples,
    prefill captures, method by name), built once per session for each (num_samples, budget): the embedded model
    and the prompts' prefill captures are shared by every test that decodes the default suite."""
    from tests.helpers import default_suite as build

    def suite(num_samples: int, budget: int = 128):
        key = ("default_suite", num_samples, budget)
        if key not in session_loads:
            session_loads[key] = build(tmp_path_factory.mktemp("default_suite"), num_samples, budget)
        return session_loads[key]

    return suite
