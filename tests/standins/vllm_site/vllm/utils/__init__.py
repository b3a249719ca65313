import importlib


def resolve_obj_by_qualname(qualname: str):
    module_name, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(module_name), name)
