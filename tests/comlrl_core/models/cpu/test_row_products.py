"""The few-row product kernel: F.linear's numbers on every input it takes, refusals that
leave the caller its own product, and a build that fails or disagrees switching it off."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from comlrl_core.models.cpu import c_library, row_products

CAN_BUILD = c_library.compiler() is not None and not isinstance(
    c_library.load("row_products", row_products._SOURCE), c_library.Unavailable
)
needs_kernel = pytest.mark.skipif(not CAN_BUILD, reason="needs Linux, a C compiler and torch on GNU OpenMP")


@needs_kernel
def test_the_kernel_is_on_where_it_can_be_built():
    assert row_products.kernel_status() == "on"


@needs_kernel
@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, row_products.MAX_ROWS),
    width=st.integers(1, 300),
    outputs=st.integers(1, 200),
    x_gap=st.integers(0, 5),
    out_gap=st.integers(0, 5),
    with_bias=st.booleans(),
    into_buffer=st.booleans(),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_it_computes_f_linear_on_any_input_it_takes(
    rows, width, outputs, x_gap, out_gap, with_bias, into_buffer, threads, seed
):
    """Rows strided apart in a wider buffer, written into a column block of another one
    (or a new tensor), with or without a bias, on 1 or 2 threads."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width + x_gap, generator=generator)[:, x_gap:]
    weight = torch.randn(outputs, width, generator=generator)
    bias = torch.randn(outputs, generator=generator) if with_bias else None
    buffer = torch.full((rows, outputs + out_gap), float("nan"))
    block = buffer[:, out_gap:] if into_buffer else None
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = row_products.row_product(x, weight, bias, block)
    finally:
        torch.set_num_threads(before)
    assert got is not None
    torch.testing.assert_close(got, F.linear(x, weight, bias), atol=1e-4 * width**0.5, rtol=1e-5)
    if into_buffer:
        assert got.data_ptr() == block.data_ptr()
        assert torch.isnan(buffer[:, :out_gap]).all()  # nothing written outside the block


def _refused():
    x, weight = torch.randn(2, 8), torch.randn(5, 8)
    yield "too many rows", (torch.randn(row_products.MAX_ROWS + 1, 8), weight, None, None)
    yield "no rows", (torch.randn(0, 8), weight, None, None)
    yield "float64", (x.double(), weight.double(), None, None)
    yield "bf16 weight", (x, weight.bfloat16(), None, None)
    yield "tracked gradient", (x, weight.clone().requires_grad_(), None, None)
    yield "transposed weight", (x, torch.randn(8, 5).t(), None, None)
    yield "strided columns", (torch.randn(2, 16)[:, ::2], weight, None, None)
    yield "mismatched width", (torch.randn(2, 7), weight, None, None)
    yield "bias of another size", (x, weight, torch.randn(4), None)
    yield "output of another shape", (x, weight, None, torch.empty(2, 6))
    yield "strided output columns", (x, weight, None, torch.empty(2, 10)[:, ::2])
    yield "one-dimensional input", (torch.randn(8), weight, None, None)


@pytest.mark.parametrize("name, inputs", list(_refused()), ids=[name for name, _ in _refused()])
def test_inputs_it_cannot_take_are_left_to_the_caller(name, inputs, monkeypatch):
    monkeypatch.setattr(row_products, "_kernel", lambda: pytest.fail("the kernel was looked up"))
    assert row_products.row_product(*inputs) is None


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, row_products.MAX_ROWS),
    width=st.integers(1, 200),
    outputs=st.lists(st.integers(1, 60), min_size=1, max_size=row_products.MAX_WEIGHTS),
    biased=st.lists(st.booleans(), min_size=row_products.MAX_WEIGHTS, max_size=row_products.MAX_WEIGHTS),
    seed=st.integers(0, 2**16),
)
def test_prepared_siblings_write_their_products_side_by_side(rows, width, outputs, biased, seed):
    """Weights of one input width prepared together: one call gives each one's F.linear in
    its own block of columns, in order, with its own bias or none."""
    generator = torch.Generator().manual_seed(seed)
    weights = [torch.randn(n, width, generator=generator) for n in outputs]
    biases = [torch.randn(n, generator=generator) if b else None for n, b in zip(outputs, biased, strict=False)]
    operand = row_products.prepare(weights, biases)
    assert operand is not None and operand.width == sum(outputs)
    x = torch.randn(rows, width, generator=generator)
    got = row_products.product(x, operand)
    assert got is not None
    want = torch.cat([F.linear(x, w, b) for w, b in zip(weights, biases, strict=True)], dim=1)
    torch.testing.assert_close(got, want, atol=1e-4 * width**0.5, rtol=1e-5)


def _unprepared():
    w = torch.randn(5, 8)
    yield "no weights", ([], None)
    yield "too many weights", ([w] * (row_products.MAX_WEIGHTS + 1), None)
    yield "two input widths", ([w, torch.randn(5, 9)], None)
    yield "a transposed sibling", ([w, torch.randn(8, 5).t()], None)
    yield "a bf16 sibling", ([w, w.bfloat16()], None)
    yield "a bias too short", ([w, w], [None, torch.randn(4)])
    yield "biases not one per weight", ([w, w], [None])


@pytest.mark.parametrize("name, inputs", list(_unprepared()), ids=[name for name, _ in _unprepared()])
def test_weights_it_cannot_take_are_not_prepared(name, inputs, monkeypatch):
    monkeypatch.setattr(row_products, "_kernel", lambda: pytest.fail("the kernel was looked up"))
    assert row_products.prepare(*inputs) is None


@needs_kernel
def test_a_prepared_product_refuses_inputs_it_cannot_take():
    weight = torch.randn(5, 8, requires_grad=True)
    with torch.no_grad():
        operand = row_products.prepare([weight])
    assert operand is not None
    with torch.no_grad():
        assert row_products.product(torch.randn(row_products.MAX_ROWS + 1, 8), operand) is None
        assert row_products.product(torch.randn(2, 9), operand) is None
        assert row_products.product(torch.randn(2, 16)[:, ::2], operand) is None
        assert row_products.product(torch.randn(2, 8), operand, torch.empty(2, 6)) is None
        assert row_products.product(torch.randn(2, 8).double(), operand) is None
        assert row_products.product(torch.randn(2, 8), operand) is not None
    assert row_products.product(torch.randn(2, 8), operand) is None  # the weight's gradient would be lost


def test_a_gradient_free_region_lets_trainable_weights_in():
    """A trainable weight under no_grad (a sampling call) is plain data to the kernel."""
    weight = torch.randn(5, 8, requires_grad=True)
    with torch.no_grad():
        got = row_products.row_product(torch.randn(1, 8), weight)
    assert (got is not None) == CAN_BUILD


def test_the_switch_turns_it_off(fresh_kernel, monkeypatch):
    monkeypatch.setenv(row_products.ENV_VAR, "off")
    assert row_products.kernel_status() == f"{row_products.ENV_VAR} is off"
    assert row_products.row_product(torch.randn(1, 8), torch.randn(5, 8)) is None
    assert not (fresh_kernel / "kernels").exists()  # nothing compiled


@needs_kernel
def test_a_failing_compiler_leaves_the_callers_products_with_one_warning(fresh_kernel, monkeypatch, caplog):
    monkeypatch.setenv("CC", shutil.which("false") or "/bin/false")
    with caplog.at_level(logging.WARNING, logger=row_products.__name__):
        status = row_products.kernel_status()
        assert row_products.kernel_status() == status  # decided once per process
    assert status.startswith("it could not be built or loaded")
    assert caplog.text.count("few-row product kernel is off") == 1
    assert row_products.row_product(torch.randn(1, 8), torch.randn(5, 8)) is None
    assert not list((fresh_kernel / "kernels").glob("*.so"))  # no half-built library left


@needs_kernel
def test_a_kernel_that_disagrees_with_f_linear_is_switched_off(fresh_kernel, monkeypatch, caplog):
    real_run = row_products.RowOperand.run

    def off_by_one_row(operand, x, out):
        real_run(operand, x, out)
        if x.shape[0] > 1:
            out[-1] += 0.01  # the last of several rows wrong: only a probe with several rows sees it

    monkeypatch.setattr(row_products.RowOperand, "run", off_by_one_row)
    with caplog.at_level(logging.WARNING, logger=row_products.__name__):
        status = row_products.kernel_status()
    assert status.startswith("its results differ from F.linear's")
    assert "few-row product kernel is off" in caplog.text


@needs_kernel
def test_each_kernel_has_its_own_library_per_source(fresh_kernel):
    """Built into the cache under its own name beside the attention kernel's."""
    assert row_products.kernel_status() == "on"
    built = sorted(path.name for path in (fresh_kernel / "kernels").glob("*.so"))
    assert len(built) == 1 and built[0].startswith("row_products-")
    compiler = c_library.compiler()
    assert compiler is not None
    edited = row_products._SOURCE + "\n/* edited */\n"
    assert c_library.library_path("row_products", edited, compiler) != str(fresh_kernel / "kernels" / built[0])
