"""The replayed trainers, one package each: `settings` (its fields, defaults and checks, and the `ReplayFamily`),
`engine` (its accumulator, imported only when a run needs it), `keys` (the keys it logs, for the metric registry),
and `TRAINERS` in the package's `__init__`. `correction.registry` finds them; nothing outside a trainer's package
names it. docs/architecture.md says how to add one.

May import: correction, engine (core, kernels, accumulators), metrics (model), errors, system; never api, answers,
gate, render, cli or io, nor another trainer (but Miles, a slime fork, builds on slime).
"""
