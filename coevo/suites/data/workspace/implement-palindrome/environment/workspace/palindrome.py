def is_palindrome(text):
    """True if `text` is a palindrome, ignoring case and every
    character that is not a letter or digit. "" is a palindrome."""
    raise NotImplementedError
