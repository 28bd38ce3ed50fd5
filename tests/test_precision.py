"""lib.precision: what ``--precision auto`` becomes on a device, and the facts it reads."""

import subprocess
import sys

import pytest
import torch

from lib import precision
from lib.run.cli import ROOT


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
@pytest.mark.parametrize("native", [True, False])
def test_auto_is_bf16_only_where_the_device_computes_it_natively(monkeypatch, device_type, native):
    monkeypatch.setattr(precision, "native_bf16", lambda d: native if d == device_type else not native)
    assert precision.resolve_precision("auto", device_type) == ("bf16" if native else "fp32")
    # An explicit choice is taken as given, emulated or not.
    assert precision.resolve_precision("bf16", device_type) == "bf16"
    assert precision.resolve_precision("fp32", device_type) == "fp32"


def test_an_unknown_precision_is_a_value_error():
    for value in ("fp16", "BF16", ""):
        with pytest.raises(ValueError, match="unknown precision"):
            precision.resolve_precision(value, "cpu")


def test_cpu_native_bf16_is_what_onednn_reports(monkeypatch):
    assert precision.native_bf16("cpu") is bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())

    class NoOneDNN:
        def __getattr__(self, name):
            raise AttributeError(name)

    # A torch build without oneDNN has no bf16 kernels for the CPU: auto is fp32 there.
    monkeypatch.setattr(torch.ops, "mkldnn", NoOneDNN())
    assert precision.native_bf16("cpu") is False
    assert precision.resolve_precision("auto", "cpu") == "fp32"


def test_cuda_native_bf16_without_the_emulation_keyword_reads_the_compute_capability(monkeypatch):
    def old_signature():  # torch 2.4's is_bf16_supported() takes no keyword
        return True

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", old_signature)
    for capability, native in (((7, 5), False), ((8, 0), True), ((9, 0), True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda cap=capability: cap)
        assert precision.native_bf16("cuda") is native, capability


def test_the_registry_reads_the_knob_without_importing_torch():
    """The sweep checks a stage's flags through lib.run.stages without torch; resolving auto is what imports it."""
    code = (
        "import sys; from lib.run.knobs import KNOBS; "
        "assert 'torch' not in sys.modules; KNOBS['precision'].resolve('fp32', 'cpu'); "
        "assert 'torch' not in sys.modules; KNOBS['precision'].resolve('auto', 'cpu'); "
        "assert 'torch' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
