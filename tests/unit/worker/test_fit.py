"""--fit (worker/runtime/fit.py): llama.cpp's common_fit_params decisions, on projections of a
memory model that is linear in the context (as llama.cpp's KV cache is) and in the offloaded
layers."""

from __future__ import annotations

from worker.runtime.fit import ALL_CONTEXT, DeviceUse, FitRequest, MiB, Projection, Use, fit

HOST = 10_000 * MiB
MODEL = 1_000 * MiB
PER_TOKEN = 64 * 1024  # KV bytes per context token
COMPUTE = 100 * MiB


def host_only(n_ctx: int, n_gpu_layers: int | None) -> Projection:
    return Projection(devices=[], host=Use(MODEL, n_ctx * PER_TOKEN, COMPUTE), host_total=HOST)


def request(**changes: object) -> FitRequest:
    base = dict(n_ctx=0, n_ctx_train=32768, n_streams=1, n_ctx_min=4096, margins=[1024 * MiB],
                n_layer=24, layers_auto=True)
    return FitRequest(**{**base, **changes})  # type: ignore[arg-type]


def test_an_unset_context_becomes_the_training_context_per_stream_when_it_fits() -> None:
    result = fit(request(n_streams=2), host_only)
    assert (result.n_ctx, result.fits) == (65536, True)


def test_a_context_that_does_not_fit_is_cut_linearly_and_aligned() -> None:
    # 32768 tokens take 2 GiB of KV: with 8000 MiB to keep free, 900 MiB of KV remains
    result = fit(request(margins=[8000 * MiB]), host_only)
    assert result.fits and 4096 <= result.n_ctx < 32768
    assert result.n_ctx % 256 == 0
    assert HOST - host_only(result.n_ctx, None).host.total >= 8000 * MiB
    assert HOST - host_only(result.n_ctx + 512, None).host.total < 8000 * MiB


def test_no_room_even_at_the_minimum_fails_at_the_minimum_context() -> None:
    result = fit(request(margins=[9900 * MiB], n_streams=2), host_only)
    assert (result.fits, result.n_ctx) == (False, 8192)


def test_a_context_given_by_the_user_or_c_0_is_never_cut() -> None:
    assert fit(request(n_ctx=20000, margins=[9900 * MiB]), host_only).n_ctx == 20000
    full = fit(request(n_ctx_min=ALL_CONTEXT, margins=[9900 * MiB]), host_only)
    assert (full.n_ctx, full.fits) == (32768, False)


def one_gpu(free: int):  # type: ignore[no-untyped-def]
    def measure(n_ctx: int, n_gpu_layers: int | None) -> Projection:
        layers = 25 if n_gpu_layers is None or n_gpu_layers < 0 else min(n_gpu_layers, 25)
        on_device = Use(MODEL * layers // 25, n_ctx * PER_TOKEN * layers // 25, COMPUTE)
        device = DeviceUse("GPU0", free=free, total=free, use=on_device)
        return Projection(devices=[device], host=Use(MODEL - on_device.model), host_total=HOST)
    return measure


def test_layers_left_to_auto_are_the_most_that_fit_on_the_device() -> None:
    result = fit(request(n_ctx=32768), one_gpu(free=2000 * MiB))
    assert result.fits and result.n_gpu_layers is not None and 0 < result.n_gpu_layers < 25
    measure = one_gpu(free=2000 * MiB)
    assert measure(32768, result.n_gpu_layers).shortfall([1024 * MiB]) == 0
    assert measure(32768, result.n_gpu_layers + 1).shortfall([1024 * MiB]) > 0


def test_layers_set_by_the_user_are_kept() -> None:
    result = fit(request(n_ctx=32768, layers_auto=False), one_gpu(free=2000 * MiB))
    assert (result.fits, result.n_gpu_layers) == (False, None)
