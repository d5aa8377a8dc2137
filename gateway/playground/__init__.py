"""The web playground: a page at `/` and `/playground` to chat with the served model, images
included, over the same OpenAI endpoints any client uses (`routes.py`; the page is plain
HTML, CSS and JavaScript modules in `static/`, no build step, nothing fetched from elsewhere).
"""
