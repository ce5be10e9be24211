"""Scraping an exposition page: one bounded HTTP GET, the text-format scanner, per-target accounting."""
