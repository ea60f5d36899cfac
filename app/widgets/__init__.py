"""Widgets of the main window."""
