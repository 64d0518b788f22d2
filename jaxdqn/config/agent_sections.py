"""The agent's config sections: acting (A1–A3), replay (L8), optim (O1–O3), loss (L1–L6),
dynamics (L7, M14, EMAs) and kernels (P1, P2). See :mod:`jaxdqn.config.sections` for the table
of every section."""

from __future__ import annotations

from dataclasses import dataclass

from jaxdqn.config.fields import BACKENDS, _f

__all__ = [
    "ActingConfig",
    "DynamicsConfig",
    "KernelsConfig",
    "LossConfig",
    "OptimConfig",
    "ReplayConfig",
]


@dataclass(frozen=True)
class ActingConfig:
    """The acting half of the iteration (A1–A3): vectorised environments and their steps."""

    num_envs: int = _f(64, "E: environments acting in parallel (vmapped)", lo=1)
    steps: int = _f(8, "K: environment steps per iteration (acting scan)", lo=1)
    instrument_sampling: str = _f(
        "length",
        "panels: the instrument of a new training episode is drawn in proportion to its train "
        "bars (length) or uniformly",
        choices=("length", "uniform"),
    )
    iqn_blend: bool = _f(True, "A2: act on Q90 blended toward Q10 by iqn_readiness (off: E[Q])")
    iqn_readiness: float = _f(0.0, "A2: initial readiness (host-set each epoch)", lo=0.0, hi=1.0)
    iqn_readiness_end: float = _f(
        0.5,
        "A2: readiness reached after iqn_readiness_epochs (seed: 1, acting on Q10 alone, which "
        "made the behaviour policy flat and starved replay of directional data)",
        lo=0.0,
        hi=1.0,
    )
    iqn_readiness_epochs: int = _f(
        20, "A2: epochs over which iqn_readiness ramps linearly to iqn_readiness_end", lo=1
    )
    position_sizing: bool = _f(True, "A3: scale positions by 1/(1+sqrt(Var[Q]))")
    kappa_start: float = _f(
        1.0, "A1: temperature factor kappa at epoch 0 (tau = kappa * max(Q gap, floor))", lo=1e-3
    )
    kappa_end: float = _f(0.25, "A1: kappa reached after kappa_epochs (then constant)", lo=1e-3)
    kappa_epochs: int = _f(20, "A1: epochs over which kappa moves linearly to kappa_end", lo=1)
    tau_floor: float = _f(
        0.01,
        "A1/L2: temperature floor in reward units (x the reward unit: 1 with reward_scale auto)",
        lo=1e-9,
    )


@dataclass(frozen=True)
class ReplayConfig:
    """Prioritised replay on device and the learner's sample from it (L8)."""

    capacity: int = _f(32768, "replay capacity in transitions", lo=16)
    learning_starts: int = _f(1024, "transitions in replay before the first update", lo=1)
    batch_size: int = _f(128, "B: transitions per learner update", lo=2)
    prioritised: bool = _f(True, "L8: prioritised replay (off: uniform sampling)")
    priority_alpha: float = _f(0.6, "L8: priority exponent", lo=0.0, hi=1.0)
    priority_beta0: float = _f(0.4, "L8: initial importance-sampling exponent", lo=0.0, hi=1.0)
    beta_anneal_updates: int = _f(20000, "L8: updates over which beta anneals to 1", lo=1)


@dataclass(frozen=True)
class OptimConfig:
    """Optimisers (O1), learner updates per iteration, and the SGDR schedule (O2, O3)."""

    updates: int = _f(4, "U: learner updates per iteration (learner scan)", lo=1)
    unroll: int = _f(
        1,
        "the learner scan's unroll: its U updates run as a loop over bodies of this many "
        "updates (1: a loop of U; >= U: no loop, one program of U updates that XLA fuses and "
        "schedules across, with no loop control between updates on a GPU; compile time grows "
        "with it). The same arithmetic either way, equal to float rounding (XLA may fuse the "
        "unrolled updates otherwise). Measured at 10 (H100, B = 4,096, one call): all off 910 "
        "-> 862 us an update, all on 1,588 -> 1,773; on a GPU the training's iteration already "
        "records the loop into its graph (program.launch.runtime.iteration_compiler_options)",
        lo=1,
    )
    pipeline: bool = _f(
        False,
        "L2/L8: each learner update learns from a batch sampled, and a target built, during "
        "the update before it (the first at the scan's start): one update stale (the replay's "
        "priorities, the target network, the support and beta of one update earlier), so on a "
        "GPU the sampling, the target network's pass and the projection can run beside the "
        "previous update's gradient instead of before it. Numerically different from the "
        "plain learner (false), which is the reference. Measured slower (H100, bf16 learner, "
        "B = 4,096: all off 566 -> 666 us an update, all on 1,075 -> 1,226; bench/RESULTS.md)",
    )
    lr: float = _f(
        3.0e-4, "O1/O2: base learning rate of the main Adam (trunk and branches)", lo=0.0
    )
    clip_norm: float = _f(10.0, "O1: global-norm gradient clip of the main Adam", lo=1e-6)
    aux_lr: float = _f(1.0e-4, "L6/O1: learning rate of the auxiliary Adam", lo=0.0)
    xlstm_lr: float = _f(1.0e-4, "L6/O1: learning rate of the xLSTM SGD", lo=0.0)
    flat: bool = _f(
        False,
        "O1: each optimiser partition over one raveled vector of its parameters (optax.flatten)"
        " and the global-norm clip's norm summed over one raveled vector of the main gradients:"
        " the same updates to float rounding in fewer, larger kernels; its checkpoints hold the "
        "moments as one vector per partition, so a run resumes only with the setting it was "
        "saved with",
    )
    sgdr_period: int = _f(20, "O2: epochs per cosine cycle T", lo=1)
    sgdr_floor: float = _f(0.1, "O2: cycle's final learning rate as a fraction of base", lo=0, hi=1)
    restart_moment_scale: float = _f(0.5, "O3: Adam mu/nu factor at each restart", lo=0, hi=1)


@dataclass(frozen=True)
class LossConfig:
    """The learner's targets and losses (L1–L6) and the target network (L2)."""

    gamma: float = _f(
        0.9,
        "discount per bar (0.9 for daily bars: a one-bar signal drowns under 0.99)",
        lo=0.0,
        hi=1.0,
    )
    n_step: int = _f(3, "n of the n-step return (bootstrap with gamma^n)", lo=1, hi=64)
    reward_scale: float | str = _f(
        "auto",
        "learning rewards = reward_scale x log equity return; auto: 1 / std of the train split's "
        "log returns per bar (Q in units of one bar's return std; every Q threshold is relative "
        "to this reward unit)",
    )
    sampled_target: bool = _f(
        True, "L2: sample the next action from softmax(E[Q']/tau) (off: argmax, plain DQN)"
    )
    target_update: str = _f(
        "polyak",
        "L2: target network update: polyak (soft, rate polyak_tau; steadier validation, "
        "docs/LEARNING.md) or hard (copy every target_period updates)",
        choices=("hard", "polyak"),
    )
    target_period: int = _f(200, "L2: updates between hard target copies", lo=1)
    polyak_tau: float = _f(0.005, "L2: Polyak rate of the soft target update", lo=0.0, hi=1.0)
    spread: bool = _f(
        False,
        "L3: spread surrogate on the action logits (off by default: it pushes up the actions the "
        "behaviour takes, so a drift learned first becomes a bias in every state; "
        "docs/LEARNING.md)",
    )
    spread_branch_scale: tuple[float, ...] = _f(
        (1.0, 0.5, 0.25, 0.25),
        "L3: per-branch spread weight (direction, magnitude, order, urgency)",
    )
    spread_weight: float = _f(
        0.1, "L3: overall weight of the bounded spread surrogate (per sample)", lo=0.0
    )
    spread_max_gap: float = _f(
        0.1,
        "L3: the spread push fades linearly to 0 as a sample's branch Q-gap reaches this many "
        "reward units (it only keeps actions from collapsing together)",
        lo=1e-6,
    )
    entropy: bool = _f(True, "L4: entropy bonus with the atom-utilisation ramp")
    entropy_base: float = _f(0.01, "L4: base entropy coefficient", lo=0.0)
    rank_rewards: bool = _f(True, "L5: rank-normalise batch rewards")
    aux_training: bool = _f(True, "L6: train denoiser, selectivity, coordination and xLSTM")


@dataclass(frozen=True)
class DynamicsConfig:
    """Training statistics (one owner: ``jaxdqn.agent.dynamics``): EMAs, L7, M14."""

    stats_alpha: float = _f(0.01, "EMA rate of reward std, utilisation and Q statistics", lo=0.0)
    eval_q_std_alpha: float = _f(
        0.3, "M14: EMA rate of the validation Q spread (host-side, once per epoch)", lo=0.0, hi=1.0
    )
    adaptive_support: bool = _f(True, "L7: EMA-tracked support (off: fixed support)")
    support_half_width: float = _f(
        10.0,
        "L7: fixed support half-width in reward units (adaptive: the first batch sets it)",
        lo=1e-6,
    )
    support_sigmas: float = _f(
        5.0,
        "L7: half-width = this many return std sigma_G = std(n-step rewards)/sqrt(1-gamma^2n)",
        lo=0.5,
    )
    support_min_half_width: float = _f(0.5, "L7: smallest half-width, in reward units", lo=1e-6)
    support_alpha: float = _f(0.01, "L7: base EMA rate of the support", lo=0.0, hi=1.0)
    support_max_alpha: float = _f(0.5, "L7: EMA rate for abnormal shifts", lo=0.0, hi=1.0)
    liquid: bool = _f(True, "M14: liquid time constants scaling the spread term")
    liquid_alpha_min: float = _f(
        0.01, "M14: Q-gap EMA rate when the gap moves as expected", lo=1e-6, hi=1.0
    )
    liquid_alpha_max: float = _f(
        0.5, "M14: Q-gap EMA rate approached under large relative surprise", lo=1e-6, hi=1.0
    )
    liquid_tau_min: float = _f(2.0, "M14: time constant of a stuck branch (updates)", lo=1e-3)
    liquid_tau_max: float = _f(50.0, "M14: time constant of a fast-learning branch", lo=1e-3)
    liquid_velocity_ref: float = _f(
        0.01, "M14: relative Q-gap velocity per update at which tau is ~76% of the way up", lo=1e-9
    )
    liquid_dt: float = _f(1.0, "M14: ODE time step per update", lo=1e-6)
    liquid_rk4_threshold: float = _f(
        1.0, "M14: RK4 instead of Euler when the xLSTM context norm exceeds this", lo=0.0
    )
    liquid_gap_mult: float = _f(10.0, "M14: target_gap = max(mult * eval_q_std_ema, floor)", lo=0.0)
    liquid_gap_floor: float = _f(
        0.05,
        "M14: floor of the spread amplifier's target gap, in reward units (the target is also "
        "capped at L3's loss.spread_max_gap)",
        lo=0.0,
    )
    liquid_max: float = _f(4.0, "M14: clip of the spread amplifier and of liquid_mod", lo=1e-3)


@dataclass(frozen=True)
class KernelsConfig:
    """Which implementation runs each Pallas kernel (auto: Pallas on GPU, jnp elsewhere)."""

    projection: str = _f(
        "auto",
        "P1: C51 projection. reference = jnp scatter-add (measured faster than the Pallas kernel "
        "on the H200, bench/RESULTS.md; its float adds land in a varying order on a GPU), "
        "dense = jnp pull (one writer per output: deterministic), pallas | interpret = a "
        "Triton pull kernel, compiled | interpreted (deterministic; falls back to dense where "
        "it cannot be built): hat up to 64 padded atoms, window above; hat | hat_interpret = "
        "the dense pull in registers (every source against every destination atom in a "
        "register tile; H100: 23.9 vs 43.3 us at the learner's 16,384 rows), window | "
        "window_interpret = the windowed pull (each atom reads 7 sources; the default until "
        "2026-12-06), auto = pallas on accelerators with train.deterministic, else reference",
        choices=(
            "auto",
            "reference",
            "dense",
            "pallas",
            "interpret",
            "hat",
            "hat_interpret",
            "window",
            "window_interpret",
        ),
    )
    kan: str = _f("auto", "P2: KAN spline gate (M4)", choices=BACKENDS)
    fused: str = _f(
        "auto",
        "fewer, larger GPU kernels: the four branches (M3-M6) as one value/gate matrix product, "
        "one gate call and one block-diagonal head product, and the learner's two "
        "target-network passes (s' and s) as one; the same parameters, equal to the reference "
        "to float rounding. fused | reference (one module per branch, one pass per input) | "
        "auto: fused on accelerators, the reference on the CPU (there the fused learner "
        "update is slower, its block-diagonal head product doing 3x the head multiply-adds, "
        "and the reference keeps CPU runs bit-identical to earlier results)",
        choices=("auto", "fused", "reference"),
    )
    heads: str = _f(
        "auto",
        "how kernels.fused computes the dueling heads (M6) of several branches at once: "
        "blockdiag = one GEMM with the block-diagonal matrix of the branches' [W_V | W_A] "
        "(m times the head multiply-adds, plain row-major operands), split = one GEMM per "
        "branch, folded = blockdiag with the dueling combination folded into the weights "
        "(W'_j = W_V + W_Aj - mean_i W_Ai: 3/4 of its multiply-adds, no dueling pass), "
        "pallas = the Triton kernels of pallas_kernels/heads.py (each branch's product "
        "alone with the dueling combination fused in, forward and backward; the jnp split "
        "where they cannot be built), interpret = those kernels under the Pallas interpreter "
        "(CPU tests). All equal to float rounding. auto = blockdiag. Without the fused "
        "branches (kernels.fused=auto on the CPU) every setting resolves to blockdiag; with "
        "kernels.fused=reference anything but auto or blockdiag is an error",
        choices=("auto", "blockdiag", "split", "folded", "pallas", "interpret"),
    )
    statistics: str = _f(
        "auto",
        "M7 (softmax, E[Z], Var[Z], quantiles of every distribution): reference = jnp, scan "
        "= jnp as one left-to-right pass over the atoms (running sums and level picks, no "
        "reductions or gathers: one fused kernel on a GPU; forward only, differentiated "
        "through the reference), pallas = one Triton kernel that reads the logits once (forward "
        "only, differentiated through the jnp reference; jnp where it cannot be built), "
        "interpret = that kernel under the Pallas interpreter (CPU tests). Equal to float "
        "rounding. auto = reference",
        choices=("auto", "reference", "scan", "pallas", "interpret"),
    )
    gated: str = _f(
        "auto",
        "how kernels.fused computes the branches' value and gate paths and gates (M3 + M4): "
        "reference = XLA's value/gate product, then the gate call and the product u * gate; "
        "pallas = one Triton kernel per call, the GEMM with the gate in its epilogue, writing "
        "only u * gate (pallas_kernels/gated.py; forward only: a differentiated pass, the "
        "learner's online network, runs the reference and gets its gradients; jnp where the "
        "kernel cannot be built), interpret = that kernel under the Pallas interpreter (CPU "
        "tests); gate = XLA's value/gate product without its bias, then one Triton kernel per "
        "call that reads u and g where the product wrote them, adds the biases (and M5's "
        "cond * W_cond for magnitude) and writes only u * gate (no bias pass over the product, "
        "no copy of the gate columns, no separate product pass; pallas_kernels/gate_product.py; "
        "forward only, as pallas; with kernels.acting=pallas acting is 1.14x faster than with "
        "that alone on an H100, bench/RESULTS.md), gate_interpret = that kernel under the "
        "Pallas interpreter; gate_grad = gate, and in the learner's differentiated pass that "
        "kernel forward and one Triton backward kernel (reads the cotangent and the product "
        "once, writes the product's cotangent, sums the bias and M4 gradients in registers; "
        "M5's magnitude call as gate; H100: all off 902 -> 885 us an update, all on 1,526 -> "
        "1,670 and 1,443 -> 1,523 in two sessions, bench/RESULTS.md), gate_grad_interpret = "
        "those kernels under the Pallas interpreter. "
        "Equal to float rounding. auto = gate where kernels.acting resolves to pallas (a GPU "
        "with the fused branches: the pair measured and learning-checked together), else "
        "reference. Without the fused branches (kernels.fused=auto on the CPU) every setting "
        "resolves to reference; with kernels.fused=reference anything but auto or reference "
        "is an error",
        choices=(
            "auto",
            "reference",
            "pallas",
            "interpret",
            "gate",
            "gate_interpret",
            "gate_grad",
            "gate_grad_interpret",
        ),
    )
    acting: str = _f(
        "auto",
        "how acting (training's actions, the evaluation walks, predict) computes what it reads "
        "of the network, E[Q], Var[Q] and the quantiles (M6 + M7): reference = the logits, then "
        "M7 (kernels.heads, kernels.statistics); pallas = the fused branches' heads as one "
        "Triton kernel per call with M7 in its epilogue, writing those statistics and never "
        "the logits, the dueling combination folded into the head weights, one program per "
        "action (pallas_kernels/head_statistics.py; forward only, acting is not "
        "differentiated; the reference where the kernel cannot be built), interpret = that "
        "kernel under the Pallas interpreter (CPU tests). Equal to float rounding. auto = "
        "pallas on a GPU with the fused branches (with kernels.gated auto = gate: acting "
        "2.5-3.3x faster at 65,536 rows on an H100, bench/RESULTS.md), else reference. "
        "Without the fused branches (kernels.fused=auto on the CPU) every setting resolves to "
        "reference; with kernels.fused=reference anything but auto or reference is an error",
        choices=("auto", "reference", "pallas", "interpret"),
    )
    matmul: str = _f(
        "f32",
        "operand precision of the model's matrix products (M1-M12): f32 = JAX's float32 "
        "default (TF32 tensor-core passes on H100/H200 GPUs; exact on the CPU), bf16 = "
        "operands rounded to bfloat16, float32 accumulation, float32 parameters and "
        "activations (faster GEMMs, different numbers; the CPU ignores it). f32 is the "
        "reference",
        choices=("f32", "bf16"),
    )
    bias_grad: str = _f(
        "gemm",
        "which Dense layers take their bias gradient as a matrix product with a block of ones "
        "(1^T dy) on accelerators: gemm = every layer, narrow = layers of fewer than 128 "
        "outputs (the wider ones by autodiff's column sum: XLA merges the ones-products of "
        "wide layers into one over their concatenated cotangents, a large copy), sum = none "
        "(autodiff's column sums everywhere). Equal to float rounding; the CPU always uses "
        "flax's form (autodiff's sums), whatever the setting. gemm is the reference",
        choices=("gemm", "narrow", "sum"),
    )
    acting_product: str = _f(
        "f32",
        "acting's value/gate product (the fused branches' [u | g] = h W before the gate "
        "kernel) in f32 or bf16: bf16 = bfloat16 operands and a bfloat16 result (float32 "
        "accumulation), read by the gate kernel and widened to float32 in registers, so the "
        "product writes and the kernel reads half the bytes (pre-activations rounded to 8 "
        "significant bits; only acting's passes: the learner and the target network keep "
        "f32). Needs kernels.acting auto, pallas or interpret and kernels.gated auto, gate, "
        "gate_interpret, gate_grad or gate_grad_interpret (it changes nothing where they "
        "resolve to reference). f32 is the reference",
        choices=("f32", "bf16"),
    )
    acting_activations: str = _f(
        "f32",
        "acting's network (trunk, VSN, the branches' product) in f32 or bf16: bf16 = every "
        "dense layer of acting's forward pass with bfloat16 operands and a bfloat16 result "
        "(float32 accumulation), so the activations between layers (SiLU, the VSN mask and "
        "product) are bfloat16 and every pass over them moves half the bytes; M12, the heads' "
        "statistics and everything after them stay float32, and the learner and the target "
        "network are untouched. Needs kernels.acting_product=bf16. f32 is the reference",
        choices=("f32", "bf16"),
    )
    learner_activations: str = _f(
        "f32",
        "the learner's network passes (the online pass it differentiates, the target pass) in "
        "f32 or bf16: bf16 = every dense layer with bfloat16 operands and a bfloat16 result "
        "(float32 accumulation), so the activations between layers and their gradients are "
        "bfloat16 and every pass over them moves half the bytes; the heads' logits, the "
        "distribution, the losses, the parameters, their gradients (float32 sums of bfloat16 "
        "products) and the optimiser stay float32. Numerically different (activations rounded "
        "to 8 significant bits); f32 is the reference",
        choices=("f32", "bf16"),
    )
    loss_head: str = _f(
        "auto",
        "how the learner computes L1's cross-entropies, L4's entropies, the online E[Q] and the "
        "atom utilisation from the online logits: reference = jnp, a pass of its own over the "
        "[B, 4, 3, N] logits for each (and for their gradients); pallas = two Triton kernels "
        "(pallas_kernels/c51_loss.py) that read the logits once forward and once backward; "
        "interpret = those kernels under the Pallas interpreter (CPU tests); dueling | "
        "dueling_interpret = those kernels reading the heads' value and advantage outputs and "
        "doing M6's dueling combination themselves (no logits written, no combination passes "
        "forward or backward; needs the fused branches with kernels.heads blockdiag or split, "
        "else as pallas); dueling_padded | dueling_padded_interpret = dueling on heads each "
        "padded to 64 columns by zero weights (whole, aligned rows for the kernels; the heads' "
        "product 25 % wider at 51 atoms). Equal to float rounding on the CPU. H100, all off: "
        "dueling_padded 507 vs 577 us an update, dueling 557 (pallas 730 vs 650 in another "
        "run); all on dueling_padded 1,062 vs 1,098. Not a default: with kernels.target_head="
        "pallas its GPU learning check gave 89.2 and 87.4 % of the oracle against the "
        "reference's 95.1 and 96.4 (bench/RESULTS.md, cause open). auto = reference",
        choices=(
            "auto",
            "reference",
            "pallas",
            "interpret",
            "dueling",
            "dueling_interpret",
            "dueling_padded",
            "dueling_padded_interpret",
        ),
    )
    target_head: str = _f(
        "auto",
        "how the learner computes its target from the target network's pass at s': reference "
        "= jnp and P1 as kernels.projection says: M6's combination, M7's softmax and E[Q'], "
        "L2's draw of a', the pick of a''s probabilities and P1's projection, each a pass of "
        "its own; pallas = one Triton kernel (pallas_kernels/c51_target.py) that reads each "
        "sample's target logits, or the heads' value and advantage outputs where "
        "kernels.loss_head makes the model give them, once and writes the projected target, "
        "the TD target and a' (P1 as a pull: deterministic); interpret = that kernel under the "
        "Pallas interpreter (CPU tests). The same draws from the same key (a' = argmax of "
        "E[Q']/tau plus the Gumbel noise jax.random.categorical adds), equal to float "
        "rounding on the CPU. H100: all off 535 vs 577 us an update, all on 1,029 vs 1,098. "
        "Not a default: with kernels.loss_head=dueling_padded its GPU learning check gave 89.2 "
        "and 87.4 % of the oracle against the reference's 95.1 and 96.4 (bench/RESULTS.md, "
        "cause open). auto = reference",
        choices=("auto", "reference", "pallas", "interpret"),
    )
