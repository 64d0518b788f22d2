"""bench/hlo_chain.py: the longest chain of dependent kernels in a module's loop body."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.hlo_chain import computations, longest_chain

# A loop body of five kernels: a → b (a two-output fusion) → c → e, and d beside them; the
# tuple-shaped fusion, the get-tuple-elements and the bitcast launch nothing.
MODULE = """\
HloModule m

%body.1 (p: (f32[8], f32[8])) -> (f32[8], f32[8]) {
  %p = (f32[8]{0}, f32[8]{0}) parameter(0)
  %x = f32[8]{0} get-tuple-element((f32[8]{0}, f32[8]{0}) %p), index=0
  %y = f32[8]{0} get-tuple-element((f32[8]{0}, f32[8]{0}) %p), index=1
  %a = f32[8]{0} fusion(f32[8]{0} %x), kind=kLoop, calls=%fa
  %b = (f32[8]{0}, f32[]) fusion(f32[8]{0} %a, f32[8]{0} %y), kind=kInput, calls=%fb
  %b0 = f32[8]{0} get-tuple-element((f32[8]{0}, f32[]) %b), index=0
  %d = f32[8]{0} fusion(f32[8]{0} %y), kind=kLoop, calls=%fd
  %c = f32[8]{0} fusion(f32[8]{0} %b0), kind=kLoop, calls=%fc
  %v = f32[8]{0} bitcast(f32[8]{0} %c)
  %e = f32[8]{0} custom-call(f32[8]{0} %v, f32[8]{0} %d), custom_call_target="k"
  ROOT %t = (f32[8]{0}, f32[8]{0}) tuple(f32[8]{0} %e, f32[8]{0} %d)
}

ENTRY %main (q: (f32[8], f32[8])) -> (f32[8], f32[8]) {
  %q = (f32[8]{0}, f32[8]{0}) parameter(0)
  %z = f32[8]{0} get-tuple-element((f32[8]{0}, f32[8]{0}) %q), index=0
  %w = f32[8]{0} fusion(f32[8]{0} %z), kind=kLoop, calls=%fw
  ROOT %l = (f32[8]{0}, f32[8]{0}) while((f32[8]{0}, f32[8]{0}) %q), condition=%c, body=%body.1
}
"""


def test_hlo_chain_follows_multi_output_fusions_and_skips_what_launches_nothing():
    assert set(computations(MODULE)) == {"body.1", "ENTRY"}
    chain = longest_chain(MODULE)
    assert chain.computation == "body.1"  # the loop's body, not the entry
    assert chain.kernels == 5
    assert chain.path == (("a", "fusion"), ("b", "fusion"), ("c", "fusion"), ("e", "custom-call"))
    entry = longest_chain(MODULE, "ENTRY")
    # w and the while are independent chains of one: the tie keeps the first scheduled
    assert entry.kernels == 2 and entry.path == (("w", "fusion"),)


def _two_layers(x, w1, w2):
    def body(_, h):
        return jnp.tanh(jnp.tanh(h @ w1) @ w2)  # product, activation, product, activation

    return jax.lax.fori_loop(0, 3, body, x)


def test_hlo_chain_of_a_compiled_loop_is_product_activation_product_activation():
    """XLA's CPU module of a loop of two layers: the chain is the loop body's four dependent
    kernels (the activations are not fused into the products there), in order."""
    x, w = jnp.ones((16, 32)), jnp.full((32, 32), 0.01)
    hlo = jax.jit(_two_layers).lower(x, w, w).compile().as_text()
    chain = longest_chain(hlo)
    assert chain.computation != "ENTRY" and chain.kernels >= 4
    names = [name for name, _ in chain.path]
    assert len(names) == 4, chain
    assert "tanh" in names[1] and "tanh" in names[3], chain  # each product then its tanh
    assert not any("tanh" in n for n in names[0::2]), chain
