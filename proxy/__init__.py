"""The HTTP servers (``kvproxy serve``, ``kvproxy route``), their settings and the ``kvproxy``
command line. Each API's folder (``openai/``, ``anthropic/``, ``gemini/``, ``responses/``)
translates its bodies for the dialect-free rooms below it; CONTRIBUTING.md maps the rooms."""
