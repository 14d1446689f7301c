"""Render jobs: Blender scenes uploaded through the browser, checked, estimated and rendered in chunks."""
