"""bench/launches.py counts what a GPU graph would launch (kernels, not views or allocations; a Triton launch once,
not the interpreter's copies), per decoder layer; its model of the step time is the byte floor plus nodes x t_node;
the committed counts (results/launches.json) are what the code counts today, and the README shows them."""
import json
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench import launches
from bench.byte_model import byte_ceiling

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results" / "launches.json"


class AllOps(TorchDispatchMode):
    """Every aten op dispatched, nothing excluded (the reference the counter must stay below)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def test_counter_counts_kernels_not_views_or_allocations():
    x = torch.arange(6.0)
    counter = launches.LaunchCounter()
    with counter:
        y = x + 1  # a kernel
        z = y.view(2, 3)  # a view
        torch.empty(3)  # an allocation
        z.sum()  # a kernel
    assert counter.aten[launches.OUTSIDE] == 4 and counter.kernels[launches.OUTSIDE] == 2


def test_a_triton_launch_counts_once_and_the_interpreters_copies_do_not():
    from baselines.quest.kernels import quest_append

    keys = torch.randn(1, 2, 32, 16)
    kmax, kmin = torch.zeros(1, 2, 2, 16), torch.zeros(1, 2, 2, 16)
    length = torch.tensor([17])  # slot 16: the first key of page 1, which restarts from it
    counter, everything = launches.LaunchCounter(), AllOps()
    with everything, counter.hooks(), counter:
        quest_append(keys, kmax, kmin, length, 16)
    assert counter.triton[launches.OUTSIDE] == 1 and counter.kernels[launches.OUTSIDE] == 1
    assert everything.n > counter.aten[launches.OUTSIDE] + 5  # the interpreter's copies happened, uncounted
    assert torch.equal(kmax[0, :, 1], keys[0, :, 16]) and torch.equal(kmin[0, :, 1], keys[0, :, 16])


@pytest.fixture(scope="module")
def model():
    return launches.build_launch_model(torch.device("cpu"))


def test_counts_are_attributed_to_each_decoder_layer(model):
    """Identical layers count alike; Quest's two dense layers (its default) launch fewer kernels than its
    selecting ones, and what runs outside the layers is counted apart."""
    full = launches.count_step(model, "fullkv", "torch", 1, False)
    layers = model.config.num_hidden_layers
    assert len({full["kernels"][i] for i in range(layers)}) == 1 and full["kernels"][launches.OUTSIDE] > 0
    quest = launches.count_step(model, "quest", "torch", 1, False)
    assert quest["kernels"][0] == quest["kernels"][1] < quest["kernels"][2] == quest["kernels"][3]


def test_model_nodes_map_the_small_models_layers_onto_a_deeper_one():
    record = dict(kernels_per_layer=[10, 11, 20, 21], kernels_outside=7)
    assert launches.model_nodes(record, 4) == 7 + 10 + 11 + 20 + 21
    assert launches.model_nodes(record, 32) == 7 + 10 + 11 + 20 + 29 * 21
    eight = dict(kernels_per_layer=[80, 81, 90, 91], kernels_outside=7)
    for batch in (1, 4, 8, 16):
        one, at8 = launches.model_nodes(record, 32), launches.model_nodes(eight, 32)
        assert launches.nodes_at_batch(record, eight, 32, batch) == pytest.approx(one + (at8 - one) * (batch - 1) / 7)


def _records(full_kernels, locks_kernels):
    out = []
    for method, k in (("fullkv", full_kernels), ("locks", locks_kernels)):
        for batch in (1, 8):
            for coverage in (False, True):
                out.append(dict(method=method, backend="triton", batch=batch, coverage=coverage,
                                kernels_per_layer=[k] * 4, kernels_outside=5))
    return out


def test_modeled_step_time_is_the_byte_floor_plus_nodes():
    """With no cost per node the modeled speedup is the byte ceiling; with one, more nodes than FullKV pull it
    below the ceiling, by exactly the nodes' time."""
    free = launches.modeled(_records(30, 30), t_node_us=0.0)
    for r in free:
        assert r["modeled_speedup"] == pytest.approx(r["byte_ceiling"], rel=1e-12)
        assert r["byte_ceiling"] == pytest.approx(byte_ceiling(r["shape"], r["context"], r["batch"]), rel=1e-12)
    costly = launches.modeled(_records(30, 60), t_node_us=2.5, bandwidth=4.5e12)
    for r, f in zip(costly, free):
        assert r["modeled_speedup"] < r["byte_ceiling"]
        extra = (r["locks_nodes"] - r["fullkv_nodes"]) * 2.5e-3
        assert r["locks_ms"] - f["locks_ms"] == pytest.approx(r["locks_nodes"] * 2.5e-3)
        assert r["locks_ms"] - r["fullkv_ms"] == pytest.approx(f["locks_ms"] - f["fullkv_ms"] + extra)


def test_committed_counts_are_what_the_code_counts(model):
    data = json.loads(RESULTS.read_text())
    for method in ("fullkv", "locks"):
        [record] = [r for r in data["counts"] if r["method"] == method and r["backend"] == "torch"
                    and r["batch"] == 1 and not r["coverage"]]
        now = launches.count_step(model, method, "torch", 1, False)
        layers = record["layers"]
        assert launches.per_layer(now["kernels"], layers) == record["kernels_per_layer"], method
        assert launches.per_layer(now["aten"], layers) == record["aten_per_layer"], method


def test_readme_shows_the_launch_tables_make_figures_writes(tmp_path):
    from paper_figs import launches as figure

    assert figure.main(["--results", str(ROOT / "results"), "--out", str(tmp_path)]) == 0
    written = (tmp_path / "launches.md").read_text()
    tables = [block for block in written.split("\n\n") if block.startswith("|")]
    readme = (ROOT / "README.md").read_text()
    assert len(tables) == 2
    for table in tables:
        assert table.strip() in readme, "a README launch table differs from paper_figs/out/launches.md"
