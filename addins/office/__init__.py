"""aa.addins.office — a simulated office with ground truth (`OfficeWorld`), the source of the
bundled publishers' events and of test data for the mining job."""

from .layout import Place, Radio
from .schedule import Person
from .world import CORRESPONDENCES, GroundTruth, OfficeWorld

__all__ = ["CORRESPONDENCES", "GroundTruth", "OfficeWorld", "Person", "Place", "Radio"]
