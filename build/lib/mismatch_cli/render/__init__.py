"""Renderers: finished reports in, tables / Markdown / JSON out. They compute nothing."""
