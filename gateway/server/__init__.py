"""The HTTP side: the app and its routes, middleware, admission, admin, metrics and logs."""
