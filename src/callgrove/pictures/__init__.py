"""Pictures of episodes: lanes per agent, calls by `seq`, parent arrows, hand-overs and rows."""

from callgrove.pictures.html import call_details, render_html
from callgrove.pictures.layout import Picture, layout
from callgrove.pictures.svg import render_svg

__all__ = ["Picture", "call_details", "layout", "render_html", "render_svg"]
