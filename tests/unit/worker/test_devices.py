"""Devices and tensor placement through ggml's backend registry (worker/runtime/devices.py,
worker/runtime/tensor_overrides.py), on this machine's real llama.cpp build."""

from __future__ import annotations

import ctypes

import llama_cpp as lc
import pytest

from worker.runtime.devices import (
    DeviceError,
    buffer_types,
    device_list_text,
    offload_devices,
    parse_devices,
)
from worker.runtime.tensor_overrides import (
    FFN_EXPERTS,
    Override,
    Placement,
    TensorOverride,
    cpu_ffn_overrides,
    parse_overrides,
)


def test_the_device_list_is_llama_servers() -> None:
    text = device_list_text()
    assert text.startswith("Available devices:\n")
    if not offload_devices():
        assert text == "Available devices:\n  (none)\n"


def test_device_names_are_checked_as_llama_server_checks_them() -> None:
    assert parse_devices("none") == []
    with pytest.raises(DeviceError, match="invalid device: NOPE0"):
        parse_devices("NOPE0")
    with pytest.raises(DeviceError, match="invalid device: CPU"):
        parse_devices("CPU")  # the CPU is not an offload device


def test_overrides_parse_and_reach_the_model_params() -> None:
    overrides = parse_overrides([r"blk\.0\.ffn_up=CPU,token_embd=CPU"])
    assert overrides == [Override(r"blk\.0\.ffn_up", "CPU"), Override("token_embd", "CPU")]
    params = lc.llama_model_default_params()
    placement = Placement(overrides, [])
    placement.apply(params)
    array = ctypes.cast(params.tensor_buft_overrides, ctypes.POINTER(TensorOverride))
    assert array[0].pattern == rb"blk\.0\.ffn_up" and array[0].buft == buffer_types()["CPU"]
    assert array[2].pattern is None and array[2].buft is None  # NULL-terminated
    devices = ctypes.cast(params.devices, ctypes.POINTER(ctypes.c_void_p))
    assert devices[0] is None  # -dev none: no device


def test_bad_overrides_are_refused_by_name() -> None:
    with pytest.raises(DeviceError, match="invalid value for --override-tensor"):
        parse_overrides(["no-equals-sign"])
    with pytest.raises(DeviceError, match="unknown buffer type: NOPE"):
        Placement([Override("x", "NOPE")])
    with pytest.raises(DeviceError, match="invalid value"):
        cpu_ffn_overrides(-1, FFN_EXPERTS)
    assert cpu_ffn_overrides(2, FFN_EXPERTS)[1].pattern == r"blk\.1" + FFN_EXPERTS
