"""URL slugs."""
import re


def slugify(text, max_length=50):
    """Turn text into a URL slug.

    * lowercase;
    * every run of one or more characters other than a-z and 0-9
      becomes a single "-";
    * no leading or trailing "-";
    * at most max_length characters; if the slug is cut, any "-"
      left at the end is removed.
    """
    text = text.lower()
    text = re.sub(r"[^a-z0-9]", "-", text)
    return text[:max_length]
