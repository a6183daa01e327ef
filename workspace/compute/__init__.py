"""Workspace compute: sandboxed execution of Functions and Notebook instances."""
