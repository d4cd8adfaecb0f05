def fizzbuzz(n):
    """Return a list of strings for the numbers 1..n.

    "FizzBuzz" for multiples of 15, "Fizz" for multiples of 3,
    "Buzz" for multiples of 5, otherwise the number itself as a
    string (e.g. "7"). fizzbuzz(0) returns [].
    """
    raise NotImplementedError
