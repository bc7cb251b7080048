"""What the model is used for: training, anomaly detection, active generalization and the OOD score.

Layer 3 of the package: imports :mod:`indeed_cli.inference`, :mod:`indeed_cli.model`, :mod:`indeed_cli.io`
and :mod:`indeed_cli.metrics`.
"""
