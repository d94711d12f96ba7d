"""Shared fixtures for the platform tests: specs and graphs built once per session."""

import pytest

from hcsim.platform import build_platform, builtin_catalog, load_platform_spec


@pytest.fixture(scope="session")
def catalog():
    return builtin_catalog()


@pytest.fixture(scope="session")
def cxl_spec():
    return load_platform_spec("paper-cxl")


@pytest.fixture(scope="session")
def traditional_spec():
    return load_platform_spec("paper-traditional")


@pytest.fixture(scope="session")
def cxl_4096(cxl_spec):
    return build_platform(cxl_spec)


@pytest.fixture(scope="session")
def traditional_4096(traditional_spec):
    return build_platform(traditional_spec)
