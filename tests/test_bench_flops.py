"""bench/flops.py: the analytic matrix-product FLOPs of one learner update (issue 33), against a
hand count of the layer shapes at smoke sizes and against the ``dot_general`` equations of the
update's jaxpr (independent of XLA's cost analysis)."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import flops  # noqa: E402
from jaxdqn import config  # noqa: E402
from jaxdqn.agent.build import build_agent, make_init  # noqa: E402
from jaxdqn.market import market as market_setup  # noqa: E402
from jaxdqn.model import network  # noqa: E402
from jaxdqn.model.dense import gemm_bias_gradient  # noqa: E402

CONFIGS = ROOT / "configs"

# configs/smoke.yaml: window 4 × 11 features of the bundled S&P 500 + 3 state entries = 47
# (> the 32-wide bottleneck, so it is used); SH1 32, SH2 16, AH 16, N 51, batch 32.
B, D, BN, SH1, SH2, AH, N = 32, 47, 32, 32, 16, 16, 51
HEAD = 4 * N  # head_value N | head_advantage 3·N


def smoke(extra=(), batch=B) -> config.Config:
    return config.load(CONFIGS / "smoke.yaml", [*extra, f"replay.batch_size={batch}"])


@pytest.fixture(scope="module")
def obs_dim() -> int:
    cfg = smoke(config.ALL_OFF)
    return build_agent(cfg, market_setup.prepare(cfg)).obs_dim


def test_smoke_observation_width_is_the_hand_counts(obs_dim):
    assert obs_dim == D


def test_all_off_fused_update_equals_a_hand_count_of_every_product():
    """Every component off, ``kernels.fused``: trunk (bottleneck, fc1, fc2), the four branches'
    value|gate product and the block-diagonal head product; target forward on s′ only."""
    forward = (
        2 * B * D * BN  # trunk.bottleneck [B,47]@[47,32]
        + 2 * B * BN * SH1  # trunk.fc1 [B,32]@[32,32]
        + 2 * B * SH1 * SH2  # trunk.fc2 [B,32]@[32,16]
        + 2 * B * SH2 * (8 * AH)  # value|gate of 4 branches [B,16]@[16,128]
        + 2 * B * (4 * AH) * (4 * HEAD)  # block-diagonal heads [B,64]@[64,816]
    )
    dw = forward  # dW = xᵀ dy of every layer: the forward's FLOPs
    dx = forward - 2 * B * D * BN  # dx = dy Wᵀ of every layer but the first (obs: no gradient)
    hand = forward + forward + dw + dx  # target forward (s′) + online forward + backward
    assert hand == 14_575_616
    assert flops.executed_flops(smoke(config.ALL_OFF), B, D, fused=True) == hand


def test_all_off_model_flops_count_each_branch_head_once():
    """The update's math: each branch's head its own [B,16]@[16,204] product (not 4× that)."""
    forward = (
        2 * B * D * BN
        + 2 * B * BN * SH1
        + 2 * B * SH1 * SH2
        + 2 * B * SH2 * (8 * AH)
        + 4 * (2 * B * AH * HEAD)  # direction, magnitude, order, urgency heads
    )
    hand = 4 * forward - 2 * B * D * BN  # target fwd + online fwd + dW + dx (no first-layer dx)
    assert flops.model_flops(smoke(config.ALL_OFF), B, D) == hand


def test_all_off_reference_branches_equal_a_hand_count():
    """``kernels.fused=reference`` (the CPU's default): per branch value, gate, head_value and
    head_advantage."""
    branch = (
        2 * B * SH2 * AH  # value [B,16]@[16,16]
        + 2 * B * SH2 * AH  # gate
        + 2 * B * AH * N  # head_value [B,16]@[16,51]
        + 2 * B * AH * (3 * N)  # head_advantage [B,16]@[16,153]
    )
    forward = 2 * B * D * BN + 2 * B * BN * SH1 + 2 * B * SH1 * SH2 + 4 * branch
    hand = 4 * forward - 2 * B * D * BN
    assert flops.executed_flops(smoke(config.ALL_OFF), B, D, fused=False) == hand


def test_all_on_fused_update_equals_a_hand_count_of_every_product():
    """Every component on: VSN, M5's separate magnitude branch, M12, the target pass over
    [s′; s] (M11's loss needs the target's E[Q] at s), M9–M11 and M13."""
    R, H, XD = 8, 8, 4  # vsn_hidden, denoise_hidden, xlstm_hidden (smoke.yaml)

    def net(rows: int) -> int:
        return (
            2 * rows * D * BN  # trunk.bottleneck
            + 2 * rows * BN * SH1  # trunk.fc1
            + 2 * rows * SH1 * SH2  # trunk.fc2
            + 2 * rows * SH2 * R  # vsn.fc1
            + 2 * rows * R * SH2  # vsn.fc2
            + 2 * rows * SH2 * (8 * AH)  # value|gate of 4 branches
            + 2 * rows * (3 * AH) * (3 * HEAD)  # block-diagonal heads: direction, order, urgency
            + 2 * rows * 3 * AH  # M5: E[Q_dir]/Δz rows of the magnitude's value path
            + 2 * rows * 3 * AH  # … and of its gate path
            + 2 * rows * AH * HEAD  # magnitude head
            + 2 * rows * SH2 * 1  # M12 selectivity
        )

    no_dx = 2 * B * D * BN + 2 * (2 * B * 3 * AH)  # bottleneck, M5 rows (stop_gradient input)
    coord = (
        4 * (2 * B * 12 * 12)  # M9 query, key, value, out [B,12]@[12,12] (2 heads × 6)
        + 4 * (2 * B * 6 * 1)  # M10 gates [B,6]@[6,1], four edges
        + 4 * (2 * B * 3 * 3)  # M10 messages [B,3]@[3,3]
        + 2 * (2 * B * 12 * H + 2 * B * H * 12)  # M11, two steps [12,8] and [8,12]
    )
    coord_no_dx = 3 * (2 * B * 12 * 12)  # M9 query/key/value read the stop_gradient E[Q]
    xlstm_forward = 4 * (2 * 12 * XD) + 2 * (2 * 12) + 2 * XD * XD + 2 * XD  # q,k,v,o; i,f; Cq; n·q
    xlstm_backward = 4 * (2 * 12 * XD) + 2 * (2 * 12) + 2 * (2 * XD * XD) + 2 * (2 * XD)
    online = net(B) + coord
    hand = (
        net(2 * B)  # target forward over [s′; s]
        + online  # online forward
        + online  # dW
        + online
        - no_dx
        - coord_no_dx  # dx
        + xlstm_forward
        + xlstm_backward
    )
    assert hand == 12_257_496
    assert flops.executed_flops(smoke(config.ALL_ON), B, D, fused=True) == hand


def test_bias_gradient_gemms_are_eight_rows_of_ones_per_online_layer():
    """On accelerators: ``ones[8, B] @ dy[B, F]`` per online layer with a bias."""
    cfg = smoke(config.ALL_OFF)
    extra = flops.executed_flops(cfg, B, D, bias_gemm=True) - flops.executed_flops(cfg, B, D)
    assert extra == 2 * 8 * B * (BN + SH1 + SH2 + 8 * AH + 4 * HEAD)


def test_gpu_yaml_all_off_is_the_issues_7_2_mflop_per_sample_and_914480_parameters():
    """configs/gpu.yaml, all off, B = 4,096, obs 91 (window 8 × 11 + 3: no bottleneck, 128 >
    91). Issue 33 quotes ≈ 7.2 MFLOP per sample (≈ 30 GFLOP) and 914,480 parameters."""
    cfg = config.load(CONFIGS / "gpu.yaml", list(config.ALL_OFF))
    fwd_macs = 91 * 512 + 512 * 256 + 256 * 2048 + 4 * (256 * 204)  # per sample, per pass
    per_sample = 2 * (4 * fwd_macs - 91 * 512)
    assert per_sample == 7_193_600
    assert flops.model_flops(cfg, 4096, 91) == 4096 * per_sample  # 29.5 GFLOP
    assert flops.network_parameters(cfg.model, 91) == 914_480


@pytest.mark.slow
def test_network_parameters_equal_the_models_count_with_every_component_off(obs_dim):
    cfg = smoke(config.ALL_OFF)
    params = network.make_model(cfg.model, obs_dim).init(jax.random.PRNGKey(0))
    assert flops.network_parameters(cfg.model, obs_dim) == network.param_count(params) == 19_168


def _jaxpr_of_update(cfg: config.Config):
    prepared = market_setup.prepare(cfg)
    agent = build_agent(cfg, prepared)
    state = make_init(agent)(prepared.market, jax.random.PRNGKey(0))
    return jax.make_jaxpr(agent.learner.update)(state), agent.obs_dim


@pytest.mark.slow
@pytest.mark.parametrize("components", ["off", "on"])
@pytest.mark.parametrize("fused", ["fused", "reference", "split"])
def test_analytic_count_equals_the_dot_generals_of_the_updates_jaxpr(components, fused):
    """The whole update (sample → targets → loss and gradient → optax → priorities → target
    network → statistics) traced on the CPU: the sum of 2·prod(dims) over its dot_general
    equations equals the analytic count exactly (``split``: fused branches, one head product
    per branch, ``kernels.heads=split``)."""
    extra = config.ALL_OFF if components == "off" else config.ALL_ON
    heads = "split" if fused == "split" else "blockdiag"
    cfg = smoke([*extra, f"kernels.fused={'reference' if fused == 'reference' else 'fused'}",
                 f"kernels.heads={heads}"])  # fmt: skip
    jaxpr, d = _jaxpr_of_update(cfg)
    counted = flops.jaxpr_flops(jaxpr)
    assert counted > 0
    assert flops.executed_flops(cfg, B, d, fused=fused != "reference", heads=heads) == counted
    if fused == "split":
        assert counted < flops.executed_flops(cfg, B, d, fused=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("components", "bias_grad"), [("off", "gemm"), ("on", "gemm"), ("on", "narrow")]
)
def test_accelerator_formulation_adds_the_bias_gemms(components, bias_grad, monkeypatch):
    """The accelerators' Dense (custom VJP, bias gradient as a GEMM) traced on the CPU with only
    ``jax.default_backend`` faked: its jaxpr holds the analytic count with ``bias_gemm`` plus
    the dx of the layers whose input has no gradient, which the custom VJP's backward computes
    and XLA drops as dead code (the first layer, M9's query/key/value) — with
    ``kernels.bias_grad=narrow`` only for the layers under 128 outputs, the rest autodiff's."""
    extra = config.ALL_OFF if components == "off" else config.ALL_ON
    cfg = smoke(
        [*extra, "kernels.fused=fused", "kernels.kan=reference", f"kernels.bias_grad={bias_grad}"]
    )
    prepared = market_setup.prepare(cfg)
    agent = build_agent(cfg, prepared)
    state = make_init(agent)(prepared.market, jax.random.PRNGKey(0))
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    counted = flops.jaxpr_flops(jax.make_jaxpr(agent.learner.update)(state))
    layers = flops.network_layers(cfg.model, D) + (
        flops.coordination_layers(cfg.model) if cfg.loss.aux_training else []
    )
    custom = [layer for layer in layers if layer.bias and gemm_bias_gradient(layer.n, bias_grad)]
    dead_dx = sum(2 * B * layer.k * layer.n for layer in custom if not layer.grad_in)
    assert flops.executed_flops(cfg, B, D, bias_gemm=True) + dead_dx == counted
    if bias_grad == "narrow":  # a wide and a narrow layer took each form
        assert any(layer.n >= 128 for layer in layers if layer.bias) and custom


def test_jaxpr_count_multiplies_a_scan_body_by_its_length():
    x = jnp.ones((4, 8))
    w = jnp.ones((8, 3))
    body = lambda c, _: (c, c @ w)
    jaxpr = jax.make_jaxpr(lambda c: jax.lax.scan(body, c, None, length=5))(x)
    assert flops.jaxpr_flops(jaxpr) == 5 * 2 * 4 * 8 * 3
    batched = jax.make_jaxpr(lambda a, b: jnp.einsum("bij,bjk->bik", a, b))(
        jnp.ones((2, 4, 8)), jnp.ones((2, 8, 3))
    )
    assert flops.jaxpr_flops(batched) == 2 * 2 * 4 * 8 * 3
