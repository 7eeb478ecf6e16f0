import sys
from types import MappingProxyType

import pytest

from npudist.telemetry.sources import registry as sources
from npudist.telemetry.sources.readings import Source
from npudist.telemetry.sources.registry import SOURCES, SourceUnavailable, load_source, resolve_name
from tests.telemetry.exp_helpers import eight_ascend


class FakeNpuSmi(Source):
    name = "npu-smi"
    vendor = "npu"

    def read(self):
        return eight_ascend()


def test_table_names_the_agreed_classes():
    assert SOURCES == {
        "npu-smi": "npudist.telemetry.sources.npu_smi:NpuSmiSource",
        "rknpu": "npudist.telemetry.sources.rknpu_sysfs:RknpuSource",
        "nvml": "npudist.telemetry.sources.nvml:NvmlSource",
        "cpu": "npudist.telemetry.sources.host_psutil:HostSource",
    }


def test_named_source_is_imported_lazily(monkeypatch):
    module = type(sys)("fake_npu_smi_module")
    module.FakeNpuSmi = FakeNpuSmi
    monkeypatch.setitem(sys.modules, "fake_npu_smi_module", module)
    monkeypatch.setattr(sources, "SOURCES", MappingProxyType({**SOURCES, "npu-smi": "fake_npu_smi_module:FakeNpuSmi"}))
    src = load_source("npu-smi")
    assert isinstance(src, FakeNpuSmi) and len(src.read()) == 8


def test_auto_uses_the_vendor_rows_telemetry_source(monkeypatch):
    monkeypatch.delenv("NPUDIST_ACCELERATOR", raising=False)
    assert resolve_name("auto") == "cpu"  # this machine has no accelerator: the cpu row's source
    assert resolve_name("nvml") == "nvml"


def test_errors_say_what_is_missing(monkeypatch):
    with pytest.raises(SourceUnavailable, match=r"unknown telemetry source 'gpu'.*npu-smi"):
        load_source("gpu")
    monkeypatch.setattr(sources, "SOURCES",
                        MappingProxyType({**SOURCES, "nvml": "npudist.telemetry.no_such_module:NvmlSource"}))
    with pytest.raises(SourceUnavailable, match=r"needs module 'npudist\.telemetry\.no_such_module'"):
        load_source("nvml")
    with pytest.raises(SourceUnavailable, match="has no class 'Nope'"):
        load_source(f"{sources.__name__}:Nope")
