"""Studies that are not runs of one decoder: ``python -m mtad.study <name>`` (top layer, docs/DESIGN.md).

- ``verifiers`` (:mod:`mtad.study.verifiers`): every accept rule judged on the same drafts and uniforms
  (common random numbers), VERIFIERS.md §6.
"""
