"""Slices: the plan of which ranks run together for real, and (next) the slice runs themselves."""
