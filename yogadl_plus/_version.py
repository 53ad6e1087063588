"""The library's version, in a module of its own: the build stamps it into every manifest
without importing the package root (which imports the build)."""

__version__ = "0.1.0"
