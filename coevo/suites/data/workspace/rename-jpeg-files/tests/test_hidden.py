import os

EXPECTED = {
    "beach.jpg": "placeholder image: beach\n",
    "sunset.jpg": "placeholder image: sunset\n",
    "city.jpg": "placeholder image: city\n",
    "cat.png": "placeholder image: cat\n",
    "notes.txt": "photos from the trip\n"
}


def test_photos():
    names = sorted(os.listdir("/app/photos"))
    assert names == sorted(EXPECTED)
    for name, text in EXPECTED.items():
        with open(os.path.join("/app/photos", name)) as f:
            assert f.read() == text
