"""Checkpoints (O6): ``checkpoint`` (orbax, latest-N ∪ best-N retention, corrupt steps moved
aside), ``contents`` (what is stored and the integrity checks on restore) and
``orbax_echoes`` (a failed read reported in one line)."""
