from fizzbuzz import fizzbuzz


def test_fifteen():
    assert fizzbuzz(15) == ["1", "2", "Fizz", "4", "Buzz", "Fizz", "7", "8",
                            "Fizz", "Buzz", "11", "Fizz", "13", "14", "FizzBuzz"]


def test_small():
    assert fizzbuzz(0) == []
    assert fizzbuzz(1) == ["1"]


def test_hundred():
    out = fizzbuzz(100)
    assert len(out) == 100
    assert out.count("FizzBuzz") == 6
    assert out.count("Fizz") == 27
    assert out.count("Buzz") == 14
    assert out[97] == "98"
    assert out[99] == "Buzz"
