"""Tests of app/store/: persistence, migrations, search, and surviving kills, corrupt and locked files."""
