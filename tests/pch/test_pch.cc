// Empty: the object library that builds tests/pch/test_pch.h (see there).
