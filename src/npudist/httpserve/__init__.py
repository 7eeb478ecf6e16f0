"""HTTP serving shared by the metrics servers and the inference front: whole requests under a deadline,
a connection cap, and replies from worker threads (``front``); pure request parsing (``request``);
a WSGI app behind the front (``wsgi``)."""

from npudist.httpserve.front import ALL_INTERFACES, Front, Limits, Reply, Request, binds_everything_unasked
from npudist.httpserve.request import Head, HttpError, parse_head
from npudist.httpserve.wsgi import wsgi_handler

__all__ = ["ALL_INTERFACES", "Front", "Head", "HttpError", "Limits", "Reply", "Request",
           "binds_everything_unasked", "parse_head", "wsgi_handler"]
