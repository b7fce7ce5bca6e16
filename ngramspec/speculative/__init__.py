"""What to draft and how long: drafters on one hash pool, the policy, the planner, the decode cost.

Layers and their import rules: docs/architecture.md."""
