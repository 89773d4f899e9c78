from os import PathLike
from typing import Any, Dict, List, Optional, Union

import numpy

__version__: str

class FtrecError(Exception): ...

class Store:
    def __init__(
        self,
        location: Union[str, PathLike],
        *,
        endpoint: Optional[str] = None,
        region: Optional[str] = None,
        access_key_id: Optional[str] = None,
        secret_access_key: Optional[str] = None,
        allow_http: Optional[bool] = None,
    ) -> None: ...
    @property
    def location(self) -> str: ...
    def checkpoints(self) -> List[Dict[str, Any]]: ...
    def job(self) -> Optional[Dict[str, Any]]: ...
    def verify(self) -> Dict[str, Any]: ...
    def state_dict(
        self,
        at: Union[None, int, str] = None,
        *,
        optimizer_state: bool = False,
        preset: Optional[str] = None,
        optimizer: Optional[str] = None,
        dense_optimizer: Optional[str] = None,
    ) -> Dict[str, numpy.ndarray]: ...
