"""What one does with a trained run: walk it over a split again (``evaluate``), ask it what to
do after a bar (``predict``), or write its policy as files that run without jaxdqn
(``export``); ``load`` restores a run with its own market for all three."""
