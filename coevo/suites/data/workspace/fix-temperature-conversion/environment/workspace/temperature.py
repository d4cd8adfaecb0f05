"""Temperature conversions."""


def c_to_f(celsius):
    """Convert degrees Celsius to degrees Fahrenheit (F = C * 9/5 + 32)."""
    return celsius * 9 / 5 - 32


def f_to_c(fahrenheit):
    """Convert degrees Fahrenheit to degrees Celsius (C = (F - 32) * 5/9)."""
    return (fahrenheit - 32) * 5 / 9
