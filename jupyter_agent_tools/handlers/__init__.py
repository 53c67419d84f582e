"""Thin Tornado handlers: parse, authorize, call a service, serialize."""
