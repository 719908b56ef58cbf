"""Evaluation and calibration tooling: datasets, metrics, the runner, reports and plots (`canvasread eval`)."""
