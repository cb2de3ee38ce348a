"""eva's creator (``eva_core.creator.Creator``) on the public seams of RL frameworks.

Each module here imports its framework and ``eva_core`` only, so it installs into the
framework's own environment with the ``eva-creator`` distribution (``creator/``), without
eva's pipeline. ``docs/trainers.md`` lists the seams and what is tested on each.
"""
