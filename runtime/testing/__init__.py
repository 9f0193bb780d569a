"""Test and benchmark helpers: throwaway Redis servers. Not used by a running node."""
