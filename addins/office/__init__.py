"""aa.addins.office — a simulated office with ground truth (`OfficeWorld`), the source of the
bundled publishers' events and of test data for the mining job."""

from .feed import WorldClock, feed
from .layout import ROOMS, Place, Radio, room_name
from .publisher import WorldPublisher
from .schedule import Person
from .world import CORRESPONDENCES, QUOTE_INTERVAL, WEATHER_INTERVAL, GroundTruth, OfficeWorld

__all__ = [
    "CORRESPONDENCES",
    "GroundTruth",
    "OfficeWorld",
    "Person",
    "Place",
    "QUOTE_INTERVAL",
    "ROOMS",
    "Radio",
    "WEATHER_INTERVAL",
    "WorldClock",
    "WorldPublisher",
    "feed",
    "room_name",
]
