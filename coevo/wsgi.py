import gc
import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coevo.settings")
application = get_wsgi_application()

# Import every view now (the URLconf loads lazily on the first request), then move what start-up
# allocated (Django, the app, their modules: ~140,000 objects that live as long as the worker)
# out of the garbage collector's reach. Otherwise each full collection walks all of it: 80-120
# ms pauses in the middle of requests that allocate many rows (a campaign page of 2,000
# proposals), the bulk of their p95 under load. With preload_app the master freezes before
# forking, which also keeps those pages shared between workers.
get_resolver().url_patterns  # noqa: B018
gc.freeze()
