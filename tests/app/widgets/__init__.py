"""Tests of app/widgets/: the chat view, panels, dialogs and labels."""
