"""``python -m jaxdqn.export RUN_DIR OUT_DIR [--checkpoint best|latest|STEP]``

Writes the run's greedy policy as a ``jax.export`` artifact that runs without jaxdqn
(:mod:`jaxdqn.program.trained.export`): ``policy.jax`` (StableHLO, any batch size, CPU and CUDA),
``params.npz``, ``normaliser.json`` and ``manifest.json``. Load it with ``jax`` and ``numpy``
alone::

    import json, numpy as np
    from jax import export
    policy = export.deserialize(bytearray(open("OUT_DIR/policy.jax", "rb").read()))
    with np.load("OUT_DIR/params.npz") as p:
        leaves = [p[k][0] for k in sorted(p.files)]          # seed 0
    obs = np.zeros((1, json.load(open("OUT_DIR/manifest.json"))["obs_dim"]), np.float32)
    actions, target_position, scale, q_mean = policy.call(obs, *leaves)

Bad input (not a run directory, no usable checkpoint, an earlier export in OUT_DIR): one line
on stderr, exit code 2.
"""

from __future__ import annotations


def _main(argv) -> int:
    import argparse
    from pathlib import Path

    from jaxdqn import config as config_lib
    from jaxdqn.program.checkpoints import checkpoint
    from jaxdqn.program.launch import cli, runtime
    from jaxdqn.program.trained import export as export_policy

    parser = argparse.ArgumentParser(
        prog="python -m jaxdqn.export",
        description="Write a run's greedy policy as a jax.export artifact with its parameters, "
        "feature normaliser and manifest.",
    )
    parser.add_argument("run_dir", help="a run directory of python -m jaxdqn.train")
    parser.add_argument("out_dir", help="a new folder for the exported files")
    cli.add_checkpoint_argument(parser)
    runtime.add_arguments(parser)
    args = parser.parse_args(argv)
    runtime.configure_from_args(args)
    which = cli.checkpoint_choice(args.checkpoint)
    try:
        manifest = export_policy.export_run(Path(args.run_dir), Path(args.out_dir), which)
    except checkpoint.CheckpointError as e:
        raise config_lib.ConfigError(f"{args.run_dir}: no usable checkpoint ({e})") from None
    print(
        f"exported checkpoint {manifest['checkpoint_step']} ({manifest['seeds']} seeds, obs_dim "
        f"{manifest['obs_dim']}, platforms {', '.join(manifest['platforms'])}) to {args.out_dir}"
    )
    return 0


def main(argv=None) -> int:
    from jaxdqn.program.launch import cli

    return cli.run_main("jaxdqn.export", _main, argv)


if __name__ == "__main__":
    import sys

    sys.exit(main())
