"""Questions that wait for other questions: `depends_on`, `ask_if` and the stages they make.

`graph` checks the references and numbers the stages; `run` walks them,
writing earlier answers into the questions that depend on them and skipping
the questions whose `ask_if` does not hold. The `Decider` drives the walk
around the Backend seam, so every backend gets stages without knowing of them.
"""
