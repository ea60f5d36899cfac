"""Tests of app/: the window, chats, attachments, comparison mode; widgets/ and store/ mirror app's own."""
