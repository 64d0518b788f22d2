"""``python -m jaxdqn.config``: print the embedded default config as commented YAML
(``configs/default.yaml`` is exactly this text)."""

from jaxdqn.config.loading import DEFAULT_HEADER, commented_yaml

print(DEFAULT_HEADER + commented_yaml())
