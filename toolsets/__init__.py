"""Tool sources beyond the persona's own tools, chosen by the composition root (``app/compose``).

Each toolset implements the core's :class:`gateway.edge.tools.ToolSource` seam and imports nothing
else of ours but the core's seams (checked by import-linter).
"""
