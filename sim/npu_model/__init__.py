"""Numpy golden model of the open neural processor (never imports Amaranth)."""
