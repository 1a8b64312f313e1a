"""Data structures shared by the inference callable and the serving runtime."""
