"""Decoding: the engine, plain and lookahead steps, drafts and their pool, Auto, chat sessions."""
